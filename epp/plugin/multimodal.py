"""Data exchanged between multimodal-cache plugins: the request's media items and, per endpoint,
which of them it is believed to have encoded already.

``mm-embeddings-cache-producer`` publishes ``MultiModalEncoderCacheMatchInfoKey/<name>``
(``ENCODER_CACHE_MATCH_INFO.key(name)``, upstream's data key name): a
``Mapping[endpoint id, EncoderCacheMatchInfo]`` covering every candidate endpoint. It publishes
nothing for a request without media, so consumers treat a missing attribute as "no signal".
``mm-embeddings-cache-scorer`` reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from epp.plugin.keys import DataType


@dataclass(frozen=True, slots=True)
class MatchItem:
    """One distinct media item of a request. ``hash`` identifies its content (the same image
    twice has one hash), ``size`` weighs it in scores (1 for every item today, as upstream) and
    ``modality`` is ``image``, ``video`` or ``audio`` (a metric label)."""

    hash: str
    size: int = 1
    modality: str = "image"


@dataclass(frozen=True, slots=True)
class EncoderCacheMatchInfo:
    """For one endpoint: the request's distinct media items, and those it likely holds encoded."""

    matched_items: tuple[MatchItem, ...]
    request_items: tuple[MatchItem, ...]

    @property
    def matched_size(self) -> int:
        return sum(item.size for item in self.matched_items)

    @property
    def total_size(self) -> int:
        return sum(item.size for item in self.request_items)


ENCODER_CACHE_MATCH_INFO: Final[DataType[Mapping[str, EncoderCacheMatchInfo]]] = DataType(
    "MultiModalEncoderCacheMatchInfoKey"
)
"""Data type of a ``Mapping[str, EncoderCacheMatchInfo]`` (endpoint id → match info)."""

MM_EMBEDDINGS_CACHE_PRODUCER: Final = "mm-embeddings-cache-producer"
"""The producer name consumers read by default (upstream's default key)."""
