"""vLLM-format KV-cache event publisher over ZMQ.

Wire format (what vLLM's ``ZmqEventPublisher`` sends): a PUB socket emits 3-frame messages

    [topic, seq, payload]

* ``topic``: ``kv@<pod>@<model>`` (UTF-8);
* ``seq``: 8-byte big-endian unsigned sequence number, starting at 0 and incremented per message;
* ``payload``: msgpack array ``[ts, events, data_parallel_rank]`` where ``ts`` is a float unix
  time, ``events`` a list of maps tagged by ``"type"``:
  ``{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
  "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"}``,
  ``{"type": "BlockRemoved", "block_hashes", "medium", "group_idx"}``,
  ``{"type": "AllBlocksCleared"}``.

  As in vLLM 0.32 (msgspec structs with ``omit_defaults``), ``lora_id`` / ``lora_name`` are
  always present (nil without LoRA); ``extra_keys`` has one entry per block: ``[lora_name]`` for a
  LoRA block, nil otherwise; ``group_idx`` is 0 (one KV-cache group) and ``kv_cache_spec_kind``
  ``"full_attention"``. ``tests/vllm/test_real_vllm.py`` checks this against a real vLLM server.

Socket rule (vLLM's): bind when the endpoint contains ``*`` or ``::`` or is ``ipc://`` /
``inproc://``; otherwise connect (the subscriber binds, llm-d's centralised layout). Messages sent
before a subscriber is attached are lost, exactly as with vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import zmq

from epp_tools.sim.config import endpoint_binds
from epp_tools.sim.kvcache import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

_GROUP_IDX = 0  # a plain decoder-only model has one KV-cache group
_SPEC_KIND = "full_attention"


def _extra_key(lora_name: str | None) -> list[str] | None:
    """The extra hash inputs of one block; the simulator has only the LoRA name."""
    return None if lora_name is None else [lora_name]


def event_map(event: KVEvent) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": event.block_hashes,
            "parent_block_hash": event.parent_block_hash,
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": event.lora_id,
            "medium": event.medium,
            "lora_name": event.lora_name,
            "extra_keys": [_extra_key(event.lora_name)] * len(event.block_hashes),
            "group_idx": _GROUP_IDX,
            "kv_cache_spec_kind": _SPEC_KIND,
        }
    if isinstance(event, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": event.block_hashes,
            "medium": event.medium,
            "group_idx": _GROUP_IDX,
        }
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    raise TypeError(f"not a KV event: {event!r}")


class KVEventPublisher:
    def __init__(self, context: zmq.Context[Any], endpoint: str, topic: str, dp_rank: int = 0):
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.dp_rank = dp_rank
        self.seq = 0
        self.sent = 0
        self._encoder = msgspec.msgpack.Encoder()
        self._socket = context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        if endpoint_binds(endpoint):
            self._socket.bind(endpoint)
        else:
            self._socket.connect(endpoint)

    @property
    def bound_endpoint(self) -> str:
        """The concrete endpoint (resolves a ``:*`` or ``:0`` port after binding)."""
        value = self._socket.getsockopt(zmq.LAST_ENDPOINT)
        return value.decode() if isinstance(value, bytes) else str(value)

    def encode(self, events: Sequence[KVEvent], ts: float) -> bytes:
        payload = [ts, [event_map(e) for e in events], self.dp_rank]
        return self._encoder.encode(payload)

    def publish(self, events: Sequence[KVEvent], ts: float) -> None:
        if not events:
            return
        frames = [self.topic, self.seq.to_bytes(8, "big"), self.encode(events, ts)]
        self.seq += 1
        try:
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            pass  # PUB drops at the high-water mark, like vLLM's publisher under back-pressure

    def close(self) -> None:
        self._socket.close(linger=0)
