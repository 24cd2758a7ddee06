"""Deciders: whether a ``disagg-profile-handler`` runs its prefill or encode stage for a request.

A decider is named in the handler's ``deciders.prefill`` / ``deciders.encode``; it implements
``epp.plugin.Decider`` (``disaggregate(cycle, request, endpoint) -> bool``), where ``endpoint`` is
the decode pick (``None`` in ``prefill-first`` order).

``prefix-based-pd-decider`` — disaggregate when the part of the prompt the decode pick does not
cache is long enough to be worth a remote prefill::

    tokens = the request's TokenizedPrompt token count (0 when nothing was tokenized)
    cached = matchBlocks(decode pick) * blockSizeTokens
    disaggregate iff nonCachedTokens > 0
                 and (promptTokens == 0 or tokens >= promptTokens)
                 and tokens - cached >= nonCachedTokens

It reads ``TokenizedPrompt/token-producer`` and
``PrefixCacheMatchInfo/approx-prefix-cache-producer`` (upstream's default keys; it declares no
``consumes`` itself: the handler declares both, so the loader creates the producers when the config
has none). Without match info for the decode pick, or without a decode pick, it says no and logs
an error (rate-limited). Parameters:

- ``nonCachedTokens`` (int, default 0, ≥ 0): uncached tokens that trigger P/D; 0 disables the
  decider (it always says no).
- ``promptTokens`` (int, default 0, ≥ 0): prompts shorter than this never disaggregate; 0 = no
  such gate.

``always-disagg-pd-decider`` — always disaggregate. No parameters.

``always-disagg-multimodal-decider`` — disaggregate (run the encode stage) when the request
carries media: a chat message content block of type ``image_url``, ``video_url``,
``input_audio`` or ``audio_url``, or an Anthropic messages content block of type ``image``
(including one inside a ``tool_result``). Text-only requests pass. No parameters. Upstream reads
the multimodal features its token producer attached to the tokenized prompt; this EPP's
``TokenizedPrompt`` carries no features, so the decider looks at the same blocks in the parsed
body directly.

YAML::

    plugins:
      - type: prefix-based-pd-decider
        parameters:
          nonCachedTokens: 512
          promptTokens: 1024
      - type: always-disagg-multimodal-decider
      - type: disagg-profile-handler
        parameters:
          deciders:
            prefill: prefix-based-pd-decider
            encode: always-disagg-multimodal-decider
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import (
    CycleState,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    PrefixMatchInfo,
)
from epp.plugins.profiles.disagg_support import PREFIX_KEY, TOKENS_KEY, RateLimitedLog

CHAT_MEDIA_BLOCKS: Final = frozenset({"image_url", "video_url", "input_audio", "audio_url"})
ANTHROPIC_MEDIA_BLOCKS: Final = frozenset({"image"})


class PrefixBasedPDDecider(PluginBase):
    TYPE: ClassVar[str] = "prefix-based-pd-decider"

    @dataclass(frozen=True)
    class Params:
        non_cached_tokens: int = 0
        prompt_tokens: int = 0

        def __post_init__(self) -> None:
            if self.non_cached_tokens < 0:
                raise ValueError(
                    "nonCachedTokens parameter of prefix disaggregation decider cannot be negative"
                )
            if self.prompt_tokens < 0:
                raise ValueError(
                    "promptTokens parameter of prefix disaggregation decider cannot be negative"
                )

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._log = handle.logger(self.typed_name)
        self._errors = RateLimitedLog(self._log, handle.clock)
        if self.params.non_cached_tokens == 0:
            self._log.info("Prefix-based PD disabled (nonCachedTokens=0)")

    def disaggregate(
        self, cycle: CycleState, request: InferenceRequest, endpoint: Endpoint | None
    ) -> bool:
        threshold = self.params.non_cached_tokens
        if threshold == 0:
            return False
        if endpoint is None:
            self._errors(logging.ERROR, "prefix decider: endpoint is nil")
            return False
        if request.body is None:
            self._errors(logging.ERROR, "prefix decider: request body is nil")
            return False
        prompt = TOKENS_KEY.get(request)
        tokens = prompt.token_count if prompt is not None else 0
        if self.params.prompt_tokens > 0 and tokens < self.params.prompt_tokens:
            return False
        if tokens < threshold:
            return False
        infos: Mapping[str, PrefixMatchInfo] | None = request.attributes.get(PREFIX_KEY)
        info = infos.get(endpoint.id) if infos is not None else None
        if info is None:
            self._errors(logging.ERROR, "prefix decider: unable to read prefix cache state")
            return False
        non_cached = tokens - info.match_blocks * info.block_size_tokens
        return non_cached >= threshold


class AlwaysDisaggPDDecider(PluginBase):
    TYPE: ClassVar[str] = "always-disagg-pd-decider"

    def disaggregate(
        self, cycle: CycleState, request: InferenceRequest, endpoint: Endpoint | None
    ) -> bool:
        return True


class AlwaysDisaggMultimodalDecider(PluginBase):
    TYPE: ClassVar[str] = "always-disagg-multimodal-decider"

    def disaggregate(
        self, cycle: CycleState, request: InferenceRequest, endpoint: Endpoint | None
    ) -> bool:
        return has_multimodal_content(request)


def has_multimodal_content(request: InferenceRequest) -> bool:
    """Whether a chat or Anthropic messages request carries an image, video or audio block."""
    body = request.body
    if body is None or body.payload is None:
        return False
    if body.kind == "chat":
        media = CHAT_MEDIA_BLOCKS
    elif body.kind == "anthropic-messages":
        media = ANTHROPIC_MEDIA_BLOCKS
    else:
        return False
    messages = body.payload.get("messages")
    if not isinstance(messages, list):
        return False
    for message in messages:
        if isinstance(message, Mapping) and _has_media(message.get("content"), media, 2):
            return True
    return False


def _has_media(content: Any, media: frozenset[str], depth: int) -> bool:
    """Whether a content list holds a media block; ``depth`` bounds nesting (tool results)."""
    if not isinstance(content, list):
        return False
    for block in _mappings(content):
        kind = block.get("type")
        if kind in media:
            return True
        nested = block.get("content") if kind == "tool_result" and depth > 0 else None
        if nested is not None and _has_media(nested, media, depth - 1):
            return True
    return False


def _mappings(items: Iterable[Any]) -> Iterable[Mapping[str, Any]]:
    return (item for item in items if isinstance(item, Mapping))
