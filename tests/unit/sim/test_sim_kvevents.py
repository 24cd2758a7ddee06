"""The map of each KV event, key by key, as vLLM 0.32 puts it on the wire."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from epp_tools.sim.kvcache import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from epp_tools.sim.kvevents import event_map


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        pytest.param(
            BlockStored([11, 12], None, list(range(8)), 4, None, None),
            {
                "type": "BlockStored",
                "block_hashes": [11, 12],
                "parent_block_hash": None,
                "token_ids": list(range(8)),
                "block_size": 4,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
                "extra_keys": [None, None],
                "group_idx": 0,
                "kv_cache_spec_kind": "full_attention",
            },
            id="stored-base-model",
        ),
        pytest.param(
            BlockStored([13], 12, [1, 2, 3, 4], 4, 1, "lora-a"),
            {
                "type": "BlockStored",
                "block_hashes": [13],
                "parent_block_hash": 12,
                "token_ids": [1, 2, 3, 4],
                "block_size": 4,
                "lora_id": 1,
                "medium": "GPU",
                "lora_name": "lora-a",
                "extra_keys": [["lora-a"]],
                "group_idx": 0,
                "kv_cache_spec_kind": "full_attention",
            },
            id="stored-lora",
        ),
        pytest.param(
            BlockRemoved([11, 12]),
            {"type": "BlockRemoved", "block_hashes": [11, 12], "medium": "GPU", "group_idx": 0},
            id="removed",
        ),
        pytest.param(AllBlocksCleared(), {"type": "AllBlocksCleared"}, id="cleared"),
    ],
)
def test_event_map_has_vllm_keys_in_wire_order_when_encoded(
    event: KVEvent, expected: dict[str, Any]
) -> None:
    mapped = event_map(event)
    assert list(mapped) == list(expected)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(mapped)) == expected
