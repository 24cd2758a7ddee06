"""``context-length-aware``: route a request by its length to pods labelled for that length
(scorer, category Affinity; also a filter when ``enableFiltering`` is on). Beta, as upstream.

Each pod may declare the context lengths it serves with the label ``label`` (default
``llm-d.ai/context-length-range``) set to ``"min-max"``, two integers with ``min <= max``
(``"0-2048"``, ``"2048-8192"``). The request's context length ``n`` is the token count of
``TokenizedPrompt/token-producer`` (the producer is created automatically when no config declares
one; ``0`` when no tokens were produced).

Score, per endpoint, with ``width = max - min``::

    no label                    -> 0.5
    malformed label             -> 0.0
    min <= n <= max, width == 0 -> 1.0
    min <= n <= max             -> 0.3 + 0.7 * (0.7 * widthScore + 0.3 * positionScore)
                                   widthScore    = 1 / (1 + width / 10000)   # tighter is higher
                                   positionScore = (max - n) / width         # headroom left
    n > max                     -> 0.3 / (1 + (n - max) / 1000)
    n < min                     -> 0.3 / (1 + (min - n) / 1000)

An in-range pod always scores in (0.3, 1] and an out-of-range one in [0, 0.3), so any in-range
pod beats every out-of-range one, and out-of-range requests go to the closest range.

Filter (only with ``enableFiltering: true``; otherwise it passes every endpoint through): keeps
unlabelled endpoints and those whose range contains ``n``; drops out-of-range and malformed ones.
When no endpoint is in range the candidate list is empty and the profile yields no result (the
request is rejected as for any filter that empties the list), exactly as upstream; keep filtering
off to send such requests to the nearest range instead.

A malformed label (not two integers separated by one ``-``, or ``min > max``) never fails a
request: the endpoint scores 0.0 and is dropped by the filter, and the value is logged once (with
the endpoint id) as a warning.

Parameters:

- ``label`` (string, default ``llm-d.ai/context-length-range``, non-empty): the pod label key.
- ``enableFiltering`` (bool, default false): also drop endpoints whose range excludes the request.

YAML::

    plugins:
      - type: context-length-aware
        name: context-router
        parameters:
          label: llm-d.ai/context-length-range
          enableFiltering: false
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: context-router
            weight: 8
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import (
    TOKENIZED_PROMPT,
    CycleState,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ScorerCategory,
    Stability,
)

DEFAULT_LABEL: Final = "llm-d.ai/context-length-range"
TOKEN_PRODUCER: Final = "token-producer"
MAX_FALLBACK_SCORE: Final = 0.3
NO_LABEL_SCORE: Final = 0.5
MALFORMED_SCORE: Final = 0.0

# Go's strconv.Atoi on a 64-bit platform: optional sign, ASCII digits, int64 range.
_INT: Final = re.compile(r"[+-]?[0-9]+")
_INT64_MAX: Final = 2**63 - 1
_CACHE_SIZE: Final = 1024  # distinct label values remembered (parsed range or malformed)

Range = tuple[int, int]


def parse_range(text: str) -> Range | None:
    """``"min-max"`` → ``(min, max)``; ``None`` when malformed (as upstream: exactly one ``-``,
    each side an integer after trimming spaces, ``min <= max``)."""
    parts = text.split("-")
    if len(parts) != 2:
        return None
    bounds = []
    for part in parts:
        part = part.strip()
        if not _INT.fullmatch(part):
            return None
        try:
            value = int(part)
        except ValueError:  # more digits than int() converts: far outside int64 anyway
            return None
        if abs(value) > _INT64_MAX:
            return None
        bounds.append(value)
    low, high = bounds
    return (low, high) if low <= high else None


def range_score(n: int, low: int, high: int) -> float:
    """The score of a pod serving ``[low, high]`` for a request of ``n`` tokens (see module)."""
    if low <= n <= high:
        width = high - low
        if width == 0:
            return 1.0
        width_score = 1.0 / (1.0 + float(width) / 10000.0)
        position_score = float(high - n) / float(width)
        raw = 0.7 * width_score + 0.3 * position_score
        return MAX_FALLBACK_SCORE + raw * (1.0 - MAX_FALLBACK_SCORE)
    distance = n - high if n > high else low - n
    return MAX_FALLBACK_SCORE / (1.0 + float(distance) / 1000.0)


class ContextLengthAware(PluginBase):
    TYPE: ClassVar[str] = "context-length-aware"
    STABILITY: ClassVar[Stability] = Stability.BETA
    category: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY

    @dataclass(frozen=True)
    class Params:
        label: str = DEFAULT_LABEL
        enable_filtering: bool = False

        def __post_init__(self) -> None:
            if not self.label:
                raise ValueError("'label' must be specified")

    params: Params

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._tokens_key = TOKENIZED_PROMPT.key(TOKEN_PRODUCER)
        self._label = params.label
        # label value → parsed range (None = malformed); bounded, cleared when full
        self._ranges: dict[str, Range | None] = {}

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._tokens_key})

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        if not self.params.enable_filtering:
            return endpoints
        n = self._context_length(request)
        kept = []
        for ep in endpoints:
            text = ep.labels.get(self._label)
            if text is None:
                kept.append(ep)
                continue
            bounds = self._range(text, ep)
            if bounds is not None and bounds[0] <= n <= bounds[1]:
                kept.append(ep)
        return kept

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        n = self._context_length(request)
        scores: dict[str, float] = {}
        for ep in endpoints:
            text = ep.labels.get(self._label)
            if text is None:
                scores[ep.id] = NO_LABEL_SCORE
                continue
            bounds = self._range(text, ep)
            scores[ep.id] = MALFORMED_SCORE if bounds is None else range_score(n, *bounds)
        return scores

    def _context_length(self, request: InferenceRequest) -> int:
        prompt = self._tokens_key.get(request)
        return prompt.token_count if prompt is not None else 0

    def _range(self, text: str, endpoint: Endpoint) -> Range | None:
        try:
            return self._ranges[text]
        except KeyError:
            pass
        bounds = parse_range(text)
        if bounds is None:
            self.handle.logger(self.typed_name).warning(
                "endpoint %s: label %s=%r is not a 'min-max' token range; it scores %s%s",
                endpoint.id,
                self._label,
                text,
                MALFORMED_SCORE,
                " and is filtered out" if self.params.enable_filtering else "",
            )
        if len(self._ranges) >= _CACHE_SIZE:
            self._ranges.clear()
        self._ranges[text] = bounds
        return bounds
