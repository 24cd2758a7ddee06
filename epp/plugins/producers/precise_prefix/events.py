"""KV-cache events from model servers: the message format and its decoding (spec §4.9).

Wire format (vLLM's ``ZmqEventPublisher``; SGLang uses the same): 3-frame messages
``[topic, seq, payload]`` with ``topic`` = ``kv@<pod-id>@<model>``, ``seq`` an 8-byte big-endian
counter per publisher and ``payload`` the msgpack array ``[ts, events, data_parallel_rank]``.
Each event is a positional array with its tag first (older vLLM, SGLang) or a map tagged by
``"type"`` (vLLM ≥ 0.11, fields equal to their default omitted: a missing key reads as nil)::

    BlockStored      [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id,
                      medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind, ...]
    BlockRemoved     [tag, block_hashes, medium, group_idx]
    AllBlocksCleared [tag]

Hashes may be unsigned or signed 64-bit integers or bytes (the last 8 bytes, big-endian);
``medium`` is lower-cased (default ``gpu``); SGLang's bigram ``token_ids`` (``[[t0, t1], [t1,
t2], …]``) are flattened. A malformed event is skipped and counted; a malformed payload drops the
message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from epp.plugin.prefix import pack_token_ids

EngineType = Literal["vllm", "sglang"]
DEFAULT_TIER: Final = "gpu"
MASK64: Final = 0xFFFFFFFFFFFFFFFF

ExtraKey = str | tuple[str, int]


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    tokens: bytes
    """Token ids packed as little-endian uint32 (``len(tokens) // 4`` tokens)."""
    block_size: int
    lora_id: int | None = None
    medium: str = DEFAULT_TIER
    lora_name: str | None = None
    extra_keys: tuple[tuple[ExtraKey, ...] | None, ...] | None = None
    group_idx: int = 0
    grouped: bool = False
    """The event named its KV-cache group (``group_idx`` not nil): a hybrid-aware engine."""
    kv_cache_spec_kind: str = ""
    """The group's attention kind (``full_attention``, ``sliding_window``, ``mamba``, …); ``""``
    when the event does not say (then the kind learned from an earlier event of the group)."""


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str = DEFAULT_TIER
    group_idx: int = 0
    grouped: bool = False


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    medium: str | None = None


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One decoded message, attributed to an endpoint."""

    endpoint: str
    model: str
    """Base model from the topic (``""`` when the topic has none)."""
    seq: int
    ts: float
    dp_rank: int | None
    events: tuple[KVEvent, ...]
    malformed: int = 0
    """Events of the message that could not be decoded (skipped)."""


class MalformedMessage(ValueError):
    pass


# ---- decoding ---------------------------------------------------------------------------------

_FIELD_ORDER: Final[Mapping[str, tuple[str, ...]]] = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}
_DECODER: Final = msgspec.msgpack.Decoder()


def parse_topic(topic: str) -> tuple[str, str]:
    """``kv@<pod>@<model>`` → ``(pod, model)``; ``kv@<model>`` → ``("", model)``."""
    parts = topic.split("@")
    if len(parts) >= 3:
        return parts[1], "@".join(parts[2:])
    if len(parts) == 2:
        return "", parts[1]
    return "", ""


def normalize_hash(value: Any) -> int:
    """uint64 / int64 / bytes (last 8 bytes, big-endian) → unsigned 64-bit int."""
    if isinstance(value, bool):
        raise MalformedMessage("hash is a boolean")
    if isinstance(value, int):
        return value & MASK64
    if isinstance(value, (bytes, bytearray)):
        if not value:
            raise MalformedMessage("empty hash bytes")
        return int.from_bytes(bytes(value[-8:]), "big")
    raise MalformedMessage(f"unsupported hash type {type(value).__name__}")


def decode_payload(
    payload: bytes, engine: EngineType = "vllm"
) -> tuple[float, int | None, list[KVEvent], int]:
    """``[ts, events, dp_rank?]`` → ``(ts, dp_rank, events, malformed event count)``."""
    try:
        batch = _DECODER.decode(payload)
    except (msgspec.DecodeError, ValueError) as exc:
        raise MalformedMessage(f"payload is not msgpack: {exc}") from None
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise MalformedMessage("payload is not [ts, events, ...]")
    ts = batch[0] if isinstance(batch[0], (int, float)) else 0.0
    rank = batch[2] if len(batch) > 2 and isinstance(batch[2], int) else None
    events: list[KVEvent] = []
    malformed = 0
    for raw in batch[1]:
        try:
            event = decode_event(raw, engine)
        except (MalformedMessage, TypeError, ValueError, OverflowError):
            malformed += 1
            continue
        if event is not None:
            events.append(event)
    return float(ts), rank, events, malformed


def decode_event(raw: Any, engine: EngineType = "vllm") -> KVEvent | None:
    """One event (array or map form) → a typed event; ``None`` for an unknown tag."""
    fields: Mapping[str, Any]
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag = raw[0]
        fields = dict(zip(_FIELD_ORDER.get(tag, ()), raw[1:], strict=False))
    elif isinstance(raw, Mapping) and isinstance(raw.get("type"), str):
        tag, fields = raw["type"], raw
    else:
        raise MalformedMessage("event is neither a tagged array nor a tagged map")
    if tag == "BlockStored":
        return _stored(fields, engine)
    if tag == "BlockRemoved":
        return BlockRemoved(
            block_hashes=_hashes(fields.get("block_hashes")),
            medium=_medium(fields.get("medium")),
            group_idx=_int_or(fields.get("group_idx"), 0),
            grouped=_is_int(fields.get("group_idx")),
        )
    if tag == "AllBlocksCleared":
        medium = fields.get("medium")
        return AllBlocksCleared(medium=medium.lower() if isinstance(medium, str) else None)
    return None


def _stored(fields: Mapping[str, Any], engine: EngineType) -> BlockStored:
    parent = fields.get("parent_block_hash")
    kind = fields.get("kv_cache_spec_kind")
    lora_name = fields.get("lora_name")
    lora_id = fields.get("lora_id")
    return BlockStored(
        block_hashes=_hashes(fields.get("block_hashes")),
        parent_block_hash=None if parent is None else normalize_hash(parent),
        tokens=_tokens(fields.get("token_ids"), engine),
        block_size=_int_or(fields.get("block_size"), 0),
        lora_id=lora_id if isinstance(lora_id, int) and not isinstance(lora_id, bool) else None,
        medium=_medium(fields.get("medium")),
        lora_name=lora_name if isinstance(lora_name, str) and lora_name else None,
        extra_keys=_extra_keys(fields.get("extra_keys")),
        group_idx=_int_or(fields.get("group_idx"), 0),
        grouped=_is_int(fields.get("group_idx")),
        kv_cache_spec_kind=kind.lower() if isinstance(kind, str) else "",
    )


def _hashes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise MalformedMessage("block_hashes is not a list")
    return tuple(normalize_hash(v) for v in value)


def _tokens(value: Any, engine: EngineType) -> bytes:
    if value is None:
        return b""
    if not isinstance(value, list):
        raise MalformedMessage("token_ids is not a list")
    if engine == "sglang" and value and isinstance(value[0], list):
        # EAGLE speculative decoding reports overlapping pairs: [[t0, t1], [t1, t2], ...]
        flat = [value[0][0], *(pair[1] for pair in value)]
        return pack_token_ids(flat)
    return pack_token_ids(value)  # TypeError / OverflowError on non-uint32 values


def _medium(value: Any) -> str:
    return value.lower() if isinstance(value, str) and value else DEFAULT_TIER


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_or(value: Any, default: int) -> int:
    return value if _is_int(value) else default


def _extra_keys(value: Any) -> tuple[tuple[ExtraKey, ...] | None, ...] | None:
    """Per-block extra keys: strings stay, ``[hash, offset]`` pairs become tuples, anything
    else becomes its text so that it still distinguishes the block."""
    if not isinstance(value, list):
        return None
    out: list[tuple[ExtraKey, ...] | None] = []
    for block in value:
        if not isinstance(block, list) or not block:
            out.append(None)
            continue
        items: list[ExtraKey] = []
        for item in block:
            if isinstance(item, str):
                items.append(item)
            elif (
                isinstance(item, list)
                and len(item) == 2
                and isinstance(item[0], str)
                and isinstance(item[1], int)
            ):
                items.append((item[0], item[1]))
            else:
                items.append(repr(item))
        out.append(tuple(items))
    return tuple(out)


# ---- sockets ----------------------------------------------------------------------------------
