"""Data exchanged between prefix-aware plugins: tokenized prompts and per-endpoint match info.

Producers publish these values in ``InferenceRequest.attributes`` under typed data keys
(``epp.plugin.keys``) of the form ``<data type>/<producer name>``:

- ``TokenizedPrompt/<name>``: a ``TokenizedPrompt`` (e.g. from ``token-producer``).
- ``PrefixCacheMatchInfo/<name>``: a ``Mapping[endpoint id, PrefixMatchInfo]`` covering every
  candidate endpoint (e.g. from ``approx-prefix-cache-producer``).

A ``TokenizedPrompt`` keeps each prompt's token ids as little-endian ``uint32`` bytes rather than
a Python list: hashing works on byte slices directly, and an 800 KB prompt stays one object
instead of 200 000 ints.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from epp.plugin.keys import DataType

TOKEN_BYTES: Final = 4
"""Bytes per token id in ``TokenizedPrompt.prompts`` (little-endian ``uint32``)."""


@dataclass(frozen=True, slots=True)
class PrefixMatchInfo:
    """How much of the request's prompt one endpoint is believed to cache, in blocks."""

    match_blocks: int
    total_blocks: int
    block_size_tokens: int


@dataclass(frozen=True, slots=True)
class TokenizedPrompt:
    """A request's prompt(s) as token ids.

    ``prompts`` holds one entry per independent prompt (a completions request with several
    prompt strings has several); each entry is that prompt's token ids packed as little-endian
    ``uint32``, so its length is a multiple of ``TOKEN_BYTES``. ``cache_salt`` is the request's
    ``cache_salt`` (``""`` when absent); prefix hashing mixes it into the first block.

    Once the request is routed, the EPP replaces it with its ``count_only`` copy (see
    ``RequestBody``): response hooks still read ``token_count``, but ``prompts`` is empty.
    """

    prompts: tuple[bytes, ...]
    cache_salt: str = ""
    _count: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        total = 0
        for i, prompt in enumerate(self.prompts):
            if len(prompt) % TOKEN_BYTES:
                raise ValueError(
                    f"prompts[{i}]: length {len(prompt)} is not a multiple of {TOKEN_BYTES}"
                )
            total += len(prompt)
        object.__setattr__(self, "_count", total // TOKEN_BYTES)

    @classmethod
    def from_token_ids(
        cls, prompts: Iterable[Sequence[int]], cache_salt: str = ""
    ) -> TokenizedPrompt:
        """Pack integer token ids (each in ``[0, 2**32)``; ``OverflowError`` otherwise)."""
        return cls(tuple(pack_token_ids(ids) for ids in prompts), cache_salt)

    @property
    def token_count(self) -> int:
        """Total number of tokens over all prompts (kept by ``count_only``)."""
        return self._count

    def count_only(self) -> TokenizedPrompt:
        """This prompt without its token ids: the same ``token_count`` and ``cache_salt``, no
        ``prompts``."""
        out = TokenizedPrompt((), self.cache_salt)
        object.__setattr__(out, "_count", self._count)
        return out

    def token_ids(self, prompt: int = 0) -> array[int]:
        """The token ids of prompt ``prompt`` as an ``array('I')`` (decoded on demand)."""
        ids = array("I")
        ids.frombytes(self.prompts[prompt])
        if _BIG_ENDIAN:
            ids.byteswap()
        return ids


_BIG_ENDIAN: Final = sys.byteorder == "big"


def pack_token_ids(ids: Sequence[int]) -> bytes:
    """Token ids → little-endian ``uint32`` bytes (a C loop; ``OverflowError`` if out of range)."""
    packed = array("I", ids)
    if packed.itemsize != TOKEN_BYTES:  # pragma: no cover - no mainstream platform does this
        raise RuntimeError("array('I') is not 32 bits wide on this platform")
    if _BIG_ENDIAN:  # pragma: no cover - CI runs little-endian
        packed.byteswap()
    return packed.tobytes()


PREFIX_MATCH_INFO: Final[DataType[Mapping[str, PrefixMatchInfo]]] = DataType("PrefixCacheMatchInfo")
"""Data type of a ``Mapping[str, PrefixMatchInfo]`` (endpoint id → match info)."""

TOKENIZED_PROMPT: Final[DataType[TokenizedPrompt]] = DataType("TokenizedPrompt")
"""Data type of a ``TokenizedPrompt``."""
