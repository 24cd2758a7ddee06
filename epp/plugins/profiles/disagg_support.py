"""What the disaggregation handlers and deciders share: the keys they read, the decision metric,
decider references resolved by name, and a rate-limited logger."""

from __future__ import annotations

import logging
import time
from typing import Any, Final

from prometheus_client import Counter

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
    PluginConfigError,
    TypedName,
)
from epp.plugin.metrics import metric_family

PREFIX_KEY: Final = PREFIX_MATCH_INFO.key("approx-prefix-cache-producer")
"""Where the prefix decider reads the decode endpoint's match info: upstream's
``PrefixCacheMatchInfoDataKey``, bound to the default producer."""
TOKENS_KEY: Final = TOKENIZED_PROMPT.key("token-producer")

DECODE_ONLY: Final = "decode-only"
PREFILL_DECODE: Final = "prefill-decode"
ENCODE_DECODE: Final = "encode-decode"
ENCODE_PREFILL_DECODE: Final = "encode-prefill-decode"

MODEL_LABEL_CAP: Final = 1000
"""Distinct ``model_name`` values a decision family labels before folding the rest into
``other`` (model names come from clients)."""
MAX_MODEL_LABEL_CHARS: Final = 256
"""A longer model name reads ``other`` (so 1000 labels stay a few hundred KB of ``/metrics``)."""

_LOG_EVERY: Final = 30.0


def decision_type(encode_used: bool, prefill_used: bool) -> str:
    """Upstream's ``DisaggDecisionType``."""
    if encode_used and prefill_used:
        return ENCODE_PREFILL_DECODE
    if encode_used:
        return ENCODE_DECODE
    return PREFILL_DECODE if prefill_used else DECODE_ONLY


class DecisionCounter:
    """``llm_d_epp_<kind>_decision_total{plugin_name, plugin_type, model_name, decision_type}``
    and its deprecated twin ``llm_d_inference_scheduler_<kind>_decision_total{model_name,
    decision_type}``; ``kind`` is ``disagg`` or ``pd``. An empty model name reads ``unknown``."""

    def __init__(self, handle: Handle, typed_name: TypedName, kind: str, doc: str) -> None:
        self._typed_name = typed_name
        self._current = metric_family(
            handle.registry,
            Counter,
            f"llm_d_epp_{kind}_decision_total",
            doc,
            ("plugin_name", "plugin_type", "model_name", "decision_type"),
        )
        self._twin = metric_family(
            handle.registry,
            Counter,
            f"llm_d_inference_scheduler_{kind}_decision_total",
            f"[Deprecated: Use llm_d_epp_{kind}_decision_total] {doc}",
            ("model_name", "decision_type"),
        )
        self._models: set[str] = set()

    def record(self, model: str, decision: str) -> None:
        model = self._label(model or "unknown")
        name = self._typed_name
        self._current.labels(name.name, name.type, model, decision).inc()
        self._twin.labels(model, decision).inc()

    def _label(self, model: str) -> str:
        if model in self._models:
            return model
        if len(self._models) >= MODEL_LABEL_CAP or len(model) > MAX_MODEL_LABEL_CHARS:
            return "other"
        self._models.add(model)
        return model


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
