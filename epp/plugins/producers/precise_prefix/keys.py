"""Request keys of the precise prefix index: canonical CBOR, FNV-64a and the block-key chain.

Engine block hashes are opaque (vLLM hashes with SHA-256 or Python's ``hash`` and a per-process
seed), so the EPP computes its own *request keys* from token ids, the same way for the blocks
that KV events report and for the prompts it routes (spec §4.9). Tokens are cut into full blocks
of ``block_size`` tokens (a partial tail block has no key) and chained::

    init      = H_seed(hashSeed bytes)
    model     = H(init, nil, modelName)                  # the chain's root for one model/LoRA
    key_i     = H(key_{i-1}, tokens_i, extra_i)          # key_{-1} = model

with two algorithms:

- ``cbor-fnv`` (upstream's default): ``H(p, t, e) = FNV-64a(canonical CBOR of [p, t, e])`` where
  ``p`` is an unsigned integer, ``t`` an array of unsigned integers (``nil`` for the model root)
  and ``e`` ``nil``, a text string, or an array of extra keys; ``H_seed`` is FNV-64a of the seed.
- ``xxh64``: ``H(p, t, e) = XXH64(LE64(p) ‖ LE32(t_0) ‖ … ‖ extra bytes)``, where each extra
  string ``s`` adds ``LE64(len(s)) ‖ s`` (a multimodal item ``(hash, offset)`` adds its hash that
  way, then ``LE64(offset)``); ``H_seed`` is XXH64 of the seed.

Extra keys taint a block: ``cache_salt`` (a string, first block only) and multimodal items
``(content hash, offset in block)``, which CBOR encodes as the map ``{"Hash": h, "Offset": o}``
as upstream's Go struct. Text-only blocks have ``nil`` extra, so text keys equal upstream's.

FNV-64a runs byte by byte in Python (about 0.25 µs per byte, ~20 µs per 16-token block), so
``cbor-fnv`` keys are memoised: each block's XXH64 twin (cheap, in C) indexes a bounded two-
generation cache of computed keys. Prompts and events repeat the same prefixes, which is when
the cache hits. ``xxh64`` needs no cache and is the mode to choose when keys need not match a Go
indexer's.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, Literal

from xxhash import xxh64_intdigest

HashAlgorithm = Literal["cbor-fnv", "xxh64"]
HASH_ALGORITHMS: Final[tuple[HashAlgorithm, ...]] = ("cbor-fnv", "xxh64")

ExtraItem = str | tuple[str, int]
"""One extra key of a block: a string (``cache_salt``) or a multimodal ``(hash, offset)``."""
Extra = tuple[ExtraItem, ...] | None
"""A block's extra keys; ``None`` for a plain text block."""

FNV_OFFSET: Final = 0xCBF29CE484222325
FNV_PRIME: Final = 0x100000001B3
MASK64: Final = 0xFFFFFFFFFFFFFFFF
TOKEN_BYTES: Final = 4
DEFAULT_CACHE_SIZE: Final = 1 << 16
"""Memoised ``cbor-fnv`` keys per generation (about 100 bytes each, two generations)."""

_LE64 = struct.Struct("<Q").pack
_BIG_ENDIAN: Final = sys.byteorder == "big"


# ---- canonical CBOR (RFC 8949 §4.2.1 "core deterministic", length-first map keys) -----------


def _head(major: int, value: int) -> bytes:
    """The shortest head for ``major`` type with argument ``value``."""
    mt = major << 5
    if value < 24:
        return bytes((mt | value,))
    if value < 0x100:
        return bytes((mt | 24, value))
    if value < 0x10000:
        return bytes((mt | 25,)) + value.to_bytes(2, "big")
    if value < 0x100000000:
        return bytes((mt | 26,)) + value.to_bytes(4, "big")
    if value <= MASK64:
        return bytes((mt | 27,)) + value.to_bytes(8, "big")
    raise ValueError(f"integer {value} does not fit CBOR's 64-bit argument")


def cbor_encode(value: Any) -> bytes:
    """Canonical CBOR of ints, bools, ``None``, str, bytes, lists/tuples and str-keyed maps."""
    if value is None:
        return b"\xf6"
    if value is True:
        return b"\xf5"
    if value is False:
        return b"\xf4"
    if isinstance(value, int):
        return _head(0, value) if value >= 0 else _head(1, -1 - value)
    if isinstance(value, str):
        data = value.encode()
        return _head(3, len(data)) + data
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return _head(2, len(data)) + data
    if isinstance(value, (list, tuple)):
        return _head(4, len(value)) + b"".join(cbor_encode(v) for v in value)
    if isinstance(value, Mapping):
        pairs = sorted(
            ((cbor_encode(k), cbor_encode(v)) for k, v in value.items()),
            key=lambda kv: (len(kv[0]), kv[0]),
        )
        return _head(5, len(pairs)) + b"".join(k + v for k, v in pairs)
    raise TypeError(f"cannot CBOR-encode {type(value).__name__}")


def fnv1a64(data: bytes, h: int = FNV_OFFSET) -> int:
    """FNV-1a, 64 bits."""
    prime, mask = FNV_PRIME, MASK64
    for byte in data:
        h = ((h ^ byte) * prime) & mask
    return h


class _UintCodes(dict[int, bytes]):
    """Token id → its CBOR encoding, filled on demand so ``map(codes.__getitem__, ids)`` runs
    in C for ids seen before. Bounded: emptied when it outgrows ``limit`` (vocabularies are
    ~10^5 ids, so this rarely happens)."""

    def __init__(self, limit: int = 1 << 18) -> None:
        super().__init__()
        self._limit = limit

    def __missing__(self, key: int) -> bytes:
        if len(self) >= self._limit:
            self.clear()
        code = self[key] = _head(0, key)
        return code


def _extra_cbor(extra: Extra) -> bytes:
    if extra is None:
        return b"\xf6"
    items = [
        item if isinstance(item, str) else {"Hash": item[0], "Offset": item[1]} for item in extra
    ]
    return cbor_encode(items)


def _extra_xxh(extra: Extra) -> bytes:
    if extra is None:
        return b""
    out = bytearray()
    for item in extra:
        text = item if isinstance(item, str) else item[0]
        data = text.encode()
        out += _LE64(len(data)) + data
        if not isinstance(item, str):
            out += _LE64(item[1] & MASK64)
    return bytes(out)


def _token_ints(block: bytes) -> Sequence[int]:
    """The uint32 token ids of a little-endian packed block."""
    if _BIG_ENDIAN:  # pragma: no cover - CI runs little-endian
        from array import array

        ids = array("I")
        ids.frombytes(block)
        ids.byteswap()
        return ids
    return memoryview(block).cast("I")


class KeyHasher:
    """Computes request keys for one token-processor configuration.

    ``tokens`` arguments are token ids packed as little-endian uint32 bytes (as in
    ``TokenizedPrompt.prompts``); only full blocks of ``block_size`` tokens get keys.
    """

    def __init__(
        self,
        *,
        algorithm: HashAlgorithm,
        block_size: int,
        hash_seed: str = "",
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        if algorithm not in HASH_ALGORITHMS:
            raise ValueError(f"hash algorithm must be one of {HASH_ALGORITHMS}, got {algorithm!r}")
        if block_size <= 0:
            raise ValueError(f"block size must be > 0, got {block_size}")
        self.algorithm: HashAlgorithm = algorithm
        self.block_size = block_size
        self.block_bytes = block_size * TOKEN_BYTES
        self._cbor = algorithm == "cbor-fnv"
        seed = hash_seed.encode()
        self.init_hash = fnv1a64(seed) if self._cbor else xxh64_intdigest(seed)
        self._tokens_head = _head(4, block_size)
        self._codes = _UintCodes()
        self._cache_size = max(1, cache_size)
        self._young: dict[int, int] = {}
        self._old: dict[int, int] = {}
        self._roots: dict[str, int] = {}
        self.cache_hits = 0
        self.cache_misses = 0

    def model_root(self, model: str) -> int:
        """``H(init, nil, model)``: the parent of a model's first block."""
        root = self._roots.get(model)
        if root is None:
            if self._cbor:
                root = fnv1a64(b"\x83" + cbor_encode(self.init_hash) + b"\xf6" + cbor_encode(model))
            else:
                data = model.encode()
                root = xxh64_intdigest(_LE64(self.init_hash) + _LE64(len(data)) + data)
            if len(self._roots) >= 1024:  # model names come from requests: keep the map small
                self._roots.clear()
            self._roots[model] = root
        return root

    def block_key(self, parent: int, block: bytes, extra: Extra = None) -> int:
        """The key of one full block (``block`` = ``block_size`` packed token ids)."""
        twin = xxh64_intdigest(_LE64(parent) + block + _extra_xxh(extra))
        if not self._cbor:
            return twin
        key = self._young.get(twin)
        if key is None:
            key = self._old.get(twin)
            if key is None:
                self.cache_misses += 1
                key = fnv1a64(self._cbor_block(parent, block, extra))
            else:
                self.cache_hits += 1
            self._remember(twin, key)
        else:
            self.cache_hits += 1
        return key

    def _cbor_block(self, parent: int, block: bytes, extra: Extra) -> bytes:
        codes = self._codes.__getitem__
        return b"".join(
            (
                b"\x83",
                _head(0, parent),
                self._tokens_head,
                b"".join(map(codes, _token_ints(block))),
                _extra_cbor(extra),
            )
        )

    def _remember(self, twin: int, key: int) -> None:
        young = self._young
        if len(young) >= self._cache_size:
            self._old, self._young = young, {}
            young = self._young
        young[twin] = key

    def iter_keys(
        self, parent: int, tokens: bytes, extras: Sequence[Extra] | None = None
    ) -> Iterator[int]:
        """Keys of the full blocks of ``tokens``, computed lazily (a lookup that stops at the
        first unknown block never hashes the rest). ``extras`` has one entry per block or is
        ``None`` (all text)."""
        step = self.block_bytes
        end = len(tokens) - len(tokens) % step
        block_key = self.block_key
        for index, start in enumerate(range(0, end, step)):
            extra = extras[index] if extras is not None and index < len(extras) else None
            parent = block_key(parent, tokens[start : start + step], extra)
            yield parent

    def keys(self, parent: int, tokens: bytes, extras: Sequence[Extra] | None = None) -> list[int]:
        return list(self.iter_keys(parent, tokens, extras))

    def block_count(self, tokens: bytes) -> int:
        return len(tokens) // self.block_bytes
