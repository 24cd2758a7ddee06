"""Data exchanged between multimodal-cache plugins, and the media items of a request body.

``media_items`` walks a chat or Anthropic messages body for its media (chat ``image_url``,
``video_url``, ``audio_url``, ``input_audio`` blocks; Anthropic ``image`` blocks, also inside
``tool_result``); ``media_summary`` is upstream's ``mm.modality`` / ``mm.hash_count`` of a
request (modalities sorted and comma-joined, or ``none``; the number of items).

Between multimodal-cache plugins: the request's media items and, per endpoint,
which of them it is believed to have encoded already.

``mm-embeddings-cache-producer`` publishes ``MultiModalEncoderCacheMatchInfoKey/<name>``
(``ENCODER_CACHE_MATCH_INFO.key(name)``, upstream's data key name): a
``Mapping[endpoint id, EncoderCacheMatchInfo]`` covering every candidate endpoint. It publishes
nothing for a request without media, so consumers treat a missing attribute as "no signal".
``mm-embeddings-cache-scorer`` reads it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from epp.plugin.keys import DataType
from epp.plugin.types import RequestBody


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


MODALITY_NONE: Final = "none"


def media_items(body: RequestBody | None) -> Iterator[tuple[str, str]]:
    """``(modality, content)`` of each media item of a chat or Anthropic messages body, in order
    (the same item twice appears twice); ``content`` is its URL or inline data."""
    if body is None or body.payload is None:
        return iter(())
    if body.kind == "chat":
        return _chat_media(body.payload)
    if body.kind == "anthropic-messages":
        return _anthropic_media(body.payload)
    return iter(())


def media_summary(body: RequestBody | None) -> tuple[str, int]:
    """``(mm.modality, mm.hash_count)``: the sorted, comma-joined modalities of the body's media
    items (``none`` without any) and their number."""
    modalities = [modality for modality, _ in media_items(body)]
    if not modalities:
        return MODALITY_NONE, 0
    return ",".join(sorted(set(modalities))), len(modalities)


def _chat_media(payload: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    for message in _objects(payload.get("messages")):
        for block in _objects(message.get("content")):
            kind = block.get("type")
            if kind == "image_url":
                yield "image", _url(block.get("image_url"))
            elif kind == "video_url":
                yield "video", _url(block.get("video_url"))
            elif kind == "audio_url":
                yield "audio", _url(block.get("audio_url"))
            elif kind == "input_audio":
                audio = block.get("input_audio")
                audio = audio if isinstance(audio, Mapping) else {}
                yield "audio", _text(audio.get("data")) + _text(audio.get("format"))


def _anthropic_media(payload: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    for message in _objects(payload.get("messages")):
        for block in _objects(message.get("content")):
            if block.get("type") == "image":
                yield "image", _source(block.get("source"))
            elif block.get("type") == "tool_result":
                for item in _objects(block.get("content")):
                    if item.get("type") == "image":
                        yield "image", _source(item.get("source"))


def _objects(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _url(value: Any) -> str:
    return _text(value.get("url")) if isinstance(value, Mapping) else _text(value)


def _source(source: Any) -> str:
    if not isinstance(source, Mapping):
        return ""
    return _text(source.get("url")) or _text(source.get("data"))
