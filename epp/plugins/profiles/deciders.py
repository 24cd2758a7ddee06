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

A handler holds each decider it names as a ``DeciderRef`` (resolved by name through
``Handle.plugin``, at construction or at startup) and asks it with ``ask``: no decider, or one
that raises, means no, and the failure is logged at most every 30 s (``RateLimitedLog``, which
the deciders log their own errors with too).

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
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import (
    PREFIX_MATCH_INFO,
    TOKENIZED_PROMPT,
    CycleState,
    Decider,
    Endpoint,
    ErrorCode,
    Handle,
    InferenceError,
    InferenceRequest,
    PluginBase,
    PluginConfigError,
    PrefixMatchInfo,
    TypedName,
)

PREFIX_KEY: Final = PREFIX_MATCH_INFO.key("approx-prefix-cache-producer")
"""Where the prefix decider reads the decode endpoint's match info: upstream's
``PrefixCacheMatchInfoDataKey``, bound to the default producer."""
TOKENS_KEY: Final = TOKENIZED_PROMPT.key("token-producer")
_LOG_EVERY: Final = 30.0

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


class RateLimitedLog:
    """A logger that says each distinct message at most once every 30 s."""

    def __init__(self, log: logging.Logger, clock: Any = time.monotonic) -> None:
        self.log = log
        self._clock = clock
        self._last: dict[str, float] = {}

    def __call__(self, level: int, message: str, *args: Any) -> None:
        now = self._clock()
        last = self._last.get(message)
        if last is not None and now - last < _LOG_EVERY:
            return
        if len(self._last) > 64:  # a few fixed messages; never grows past a handful
            self._last.clear()
        self._last[message] = now
        self.log.log(level, message, *args)


class DeciderRef:
    """A decider named in a handler's parameters, resolved through ``Handle.plugin``.

    The loader may build the handler before the decider it names (upstream's own sample configs
    declare the handler first), so a name not found at construction is resolved again by
    ``resolve`` (called at startup) and on first use. ``field`` is the parameter path used in
    errors (``deciders.prefill``)."""

    def __init__(self, handle: Handle, owner: TypedName, field: str, name: str) -> None:
        self._handle = handle
        self._owner = owner
        self.field = field
        self.name = name
        self._decider: Decider | None = None
        if name:
            self._try()

    def _try(self) -> Any:
        try:
            found = self._handle.plugin(self.name)
        except LookupError:
            return None
        if found is not None and isinstance(found, Decider):
            self._decider = found
        return found

    def resolve(self) -> Decider | None:
        """The decider (``None`` when no name is configured); raises ``PluginConfigError`` when the
        name is not a configured plugin or that plugin is not a decider."""
        if self._decider is not None or not self.name:
            return self._decider
        found = self._try()
        if self._decider is None:
            problem = (
                f"plugin not found: {self.name}"
                if found is None
                else f"plugin {self.name} ({found.typed_name.type}) is not a decider"
            )
            owner = self._owner
            raise PluginConfigError(
                plugin=owner.name, type_name=owner.type, path=self.field, problem=problem
            )
        return self._decider

    def get(self) -> Decider | None:
        """``resolve`` on the request path: a failure fails the request with a 500 that names
        the parameter (the EPP normally refuses to start first, see ``resolve``)."""
        if self._decider is not None or not self.name:
            return self._decider
        try:
            return self.resolve()
        except PluginConfigError as exc:
            raise InferenceError(ErrorCode.INTERNAL, str(exc)) from None


def ask(
    decider: Decider | None,
    cycle: CycleState,
    request: InferenceRequest,
    endpoint: Endpoint | None,
    errors: RateLimitedLog,
) -> bool:
    """The decider's answer; no decider, or one that raises (logged), means no."""
    if decider is None:
        return False
    try:
        return bool(decider.disaggregate(cycle, request, endpoint))
    except Exception as exc:
        errors(logging.ERROR, "decider %s failed, stage skipped: %r", decider.typed_name, exc)
        return False
