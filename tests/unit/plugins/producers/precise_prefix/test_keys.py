from __future__ import annotations

import struct
from typing import Any

import pytest
from xxhash import xxh64_intdigest

from epp.plugin.prefix import pack_token_ids
from epp.plugins.producers.precise_prefix.keys import KeyHasher, cbor_encode, fnv1a64

# ---- plain reference implementations, written from the specs independently of the module ----

FNV_OFFSET = 14695981039346656037
FNV_PRIME = 1099511628211


def ref_fnv(data: bytes) -> int:
    h = FNV_OFFSET
    for byte in data:
        h ^= byte
        h = (h * FNV_PRIME) % 2**64
    return h


def ref_head(major: int, n: int) -> bytes:
    if n <= 23:
        return bytes([major * 32 + n])
    for extra, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if n < 2 ** (8 * struct.calcsize(fmt)):
            return bytes([major * 32 + extra]) + struct.pack(fmt, n)
    raise AssertionError(n)


def ref_key_cbor(parent: int, tokens: list[int] | None, extra: Any) -> int:
    """FNV-64a of canonical CBOR [parent, tokens, extra] for extra None or a text string."""
    out = ref_head(4, 3) + ref_head(0, parent)
    if tokens is None:
        out += b"\xf6"
    else:
        out += ref_head(4, len(tokens)) + b"".join(ref_head(0, t) for t in tokens)
    if extra is None:
        out += b"\xf6"
    elif isinstance(extra, str):
        out += ref_head(3, len(extra.encode())) + extra.encode()
    else:  # a list of strings
        out += ref_head(4, len(extra))
        out += b"".join(ref_head(3, len(s.encode())) + s.encode() for s in extra)
    return ref_fnv(out)


def ref_key_xxh(parent: int, tokens: list[int], extras: list[str] | None) -> int:
    data = struct.pack("<Q", parent) + struct.pack(f"<{len(tokens)}I", *tokens)
    for s in extras or []:
        data += struct.pack("<Q", len(s.encode())) + s.encode()
    return xxh64_intdigest(data)


def ref_chain(algorithm: str, seed: str, model: str, tokens: list[int], size: int) -> list[int]:
    if algorithm == "cbor-fnv":
        parent = ref_key_cbor(ref_fnv(seed.encode()), None, model)
    else:
        init = xxh64_intdigest(seed.encode())
        parent = xxh64_intdigest(
            struct.pack("<Q", init) + struct.pack("<Q", len(model.encode())) + model.encode()
        )
    keys = []
    for i in range(0, len(tokens) - size + 1, size):
        block = tokens[i : i + size]
        if algorithm == "cbor-fnv":
            parent = ref_key_cbor(parent, block, None)
        else:
            parent = ref_key_xxh(parent, block, None)
        keys.append(parent)
    return keys


# ---- CBOR --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "hex_"),
    [  # RFC 8949 Appendix A
        pytest.param(0, "00", id="0"),
        pytest.param(23, "17", id="23"),
        pytest.param(24, "1818", id="24"),
        pytest.param(100, "1864", id="100"),
        pytest.param(1000, "1903e8", id="1000"),
        pytest.param(1000000, "1a000f4240", id="1e6"),
        pytest.param(1000000000000, "1b000000e8d4a51000", id="1e12"),
        pytest.param(2**64 - 1, "1bffffffffffffffff", id="max-uint64"),
        pytest.param(-1, "20", id="minus-1"),
        pytest.param(-1000, "3903e7", id="minus-1000"),
        pytest.param("", "60", id="empty-text"),
        pytest.param("a", "6161", id="text-a"),
        pytest.param("IETF", "6449455446", id="text-ietf"),
        pytest.param("ü", "62c3bc", id="text-utf8"),
        pytest.param(b"\x01\x02\x03\x04", "4401020304", id="bytes"),
        pytest.param([], "80", id="empty-array"),
        pytest.param([1, 2, 3], "83010203", id="array"),
        pytest.param([1, [2, 3], [4, 5]], "8301820203820405", id="nested-array"),
        pytest.param(
            list(range(1, 26)),
            "98190102030405060708090a0b0c0d0e0f101112131415161718181819",
            id="25-items",
        ),
        pytest.param({}, "a0", id="empty-map"),
        pytest.param({"a": 1, "b": [2, 3]}, "a26161016162820203", id="map"),
        pytest.param(None, "f6", id="null"),
        pytest.param(True, "f5", id="true"),
        pytest.param(False, "f4", id="false"),
    ],
)
def test_cbor_encoding_matches_rfc_vectors_when_encoding_values(value: Any, hex_: str) -> None:
    assert cbor_encode(value).hex() == hex_


def test_cbor_map_keys_sort_length_first_when_canonical() -> None:
    # "b" (2 encoded bytes) sorts before "aa" (3), then bytewise: core deterministic encoding.
    assert cbor_encode({"aa": 1, "b": 2, "a": 3}).hex() == "a3" + "616103" + "616202" + "62616101"


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(1.5, id="float"),
        pytest.param(2**64, id="too-big"),
        pytest.param(object(), id="object"),
    ],
)
def test_cbor_rejects_value_when_outside_the_supported_subset(value: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        cbor_encode(value)


# ---- FNV ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [  # published FNV-1a 64 test vectors
        pytest.param(b"", 0xCBF29CE484222325, id="empty"),
        pytest.param(b"a", 0xAF63DC4C8601EC8C, id="a"),
        pytest.param(b"foobar", 0x85944171F73967E8, id="foobar"),
    ],
)
def test_fnv1a64_matches_published_vectors_when_hashing(data: bytes, expected: int) -> None:
    assert fnv1a64(data) == expected == ref_fnv(data)


# ---- key chains --------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["cbor-fnv", "xxh64"])
@pytest.mark.parametrize(
    ("seed", "model", "tokens"),
    [
        pytest.param("", "m", list(range(40)), id="small-ids"),
        pytest.param("42", "llama", [70000 + i for i in range(33)], id="wide-ids-partial-tail"),
        pytest.param("", "", [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1] * 4, id="boundaries"),
    ],
)
def test_keys_equal_reference_chain_when_hashed_in_either_mode(
    algorithm: Any, seed: str, model: str, tokens: list[int]
) -> None:
    hasher = KeyHasher(algorithm=algorithm, block_size=8, hash_seed=seed)
    keys = hasher.keys(hasher.model_root(model), pack_token_ids(tokens))
    assert keys == ref_chain(algorithm, seed, model, tokens, 8)
    assert len(keys) == len(tokens) // 8


@pytest.mark.parametrize("algorithm", ["cbor-fnv", "xxh64"])
def test_salt_extra_changes_first_and_later_keys_when_present(algorithm: Any) -> None:
    hasher = KeyHasher(algorithm=algorithm, block_size=4)
    tokens = pack_token_ids(range(12))
    root = hasher.model_root("m")
    plain = hasher.keys(root, tokens)
    salted = hasher.keys(root, tokens, [("salt",)])
    assert all(a != b for a, b in zip(plain, salted, strict=True))
    parent = root
    expected = []
    for i, extra in enumerate(["salt", None, None]):
        block = list(range(i * 4, i * 4 + 4))
        if algorithm == "cbor-fnv":
            parent = ref_key_cbor(parent, block, None if extra is None else [extra])
        else:
            parent = ref_key_xxh(parent, block, None if extra is None else [extra])
        expected.append(parent)
    assert salted == expected


def test_multimodal_extra_encodes_as_hash_offset_map_when_cbor() -> None:
    hasher = KeyHasher(algorithm="cbor-fnv", block_size=2)
    block = pack_token_ids([7, 8])
    expected = ref_fnv(
        bytes.fromhex("83")
        + ref_head(0, 5)
        + bytes.fromhex("820708")
        + bytes.fromhex("81a2")
        + b"\x64Hash"
        + b"\x63abc"
        + b"\x66Offset"
        + bytes.fromhex("01")
    )
    assert hasher.block_key(5, block, (("abc", 1),)) == expected


@pytest.mark.parametrize(
    ("model_a", "model_b", "seed_a", "seed_b"),
    [
        pytest.param("m", "lora-a", "", "", id="model"),
        pytest.param("m", "m", "", "1", id="seed"),
    ],
)
def test_roots_differ_when_model_or_seed_differs(
    model_a: str, model_b: str, seed_a: str, seed_b: str
) -> None:
    a = KeyHasher(algorithm="cbor-fnv", block_size=16, hash_seed=seed_a).model_root(model_a)
    b = KeyHasher(algorithm="cbor-fnv", block_size=16, hash_seed=seed_b).model_root(model_b)
    assert a != b


def test_cached_keys_equal_fresh_keys_when_prefix_repeats() -> None:
    hasher = KeyHasher(algorithm="cbor-fnv", block_size=4, cache_size=3)
    tokens = pack_token_ids(range(40))
    root = hasher.model_root("m")
    first = hasher.keys(root, tokens)
    second = hasher.keys(root, tokens)
    assert first == second == ref_chain("cbor-fnv", "", "m", list(range(40)), 4)
    assert hasher.cache_misses >= 10
    # two generations of 3 entries: at most 6 remembered, so most of the repeat missed again
    assert len(hasher._young) + len(hasher._old) <= 6


def test_iter_keys_hashes_only_consumed_blocks_when_stopped_early() -> None:
    hasher = KeyHasher(algorithm="cbor-fnv", block_size=4)
    keys = hasher.iter_keys(hasher.model_root("m"), pack_token_ids(range(4000)))
    assert [next(keys), next(keys)] == ref_chain("cbor-fnv", "", "m", list(range(8)), 4)
    assert hasher.cache_misses == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param(
            {"algorithm": "sha1", "block_size": 16},
            "hash algorithm must be one of \\('cbor\\-fnv",
            id="algorithm",
        ),
        pytest.param(
            {"algorithm": "xxh64", "block_size": 0},
            "block size must be > 0, got 0",
            id="block-size",
        ),
    ],
)
def test_hasher_rejects_config_when_invalid(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        KeyHasher(**kwargs)
