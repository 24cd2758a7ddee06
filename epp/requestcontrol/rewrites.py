"""InferenceModelRewrite resolution: incoming model → target model (spec §7.3).

A ``ModelRewrite`` (one InferenceModelRewrite object) holds ordered rules; a rule matches a set of
exact model names, or every model when it lists none (a *generic* rule), and carries weighted
targets. For an incoming model the store picks one rule:

1. a rule that names the model exactly beats any generic rule;
2. among objects with such a rule, the oldest ``creationTimestamp`` wins (objects without one,
   e.g. declared in a file, count as oldest, in declaration order; then by name);
3. within one object, the first matching rule wins.

The target is drawn at random with probability ``weight / sum(weights)``. Targets without a
weight are never drawn while a sibling has one; when no target has a weight the draw is uniform.
The random source is the caller's (seeded in tests). ``resolve`` is O(1): the winning rule per
model is computed once in ``replace``.

Example object (CRD ``llm-d.ai/v1alpha2``, or a YAML file given to ``--objectives-file``)::

    apiVersion: llm-d.ai/v1alpha2
    kind: InferenceModelRewrite
    metadata: {name: canary}
    spec:
      poolRef: {name: my-pool}
      rules:
      - matches: [{model: {type: Exact, value: llama}}]
        targets:
        - {modelRewrite: llama-v1, weight: 90}
        - {modelRewrite: llama-v2, weight: 10}
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from epp.plugin import (
    Endpoint,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    Parser,
    ParseResult,
    wire,
)


@dataclass(frozen=True, slots=True)
class RewriteTarget:
    model: str
    weight: int | None = None


@dataclass(frozen=True, slots=True)
class RewriteRule:
    models: tuple[str, ...]
    """Exact model names this rule matches; empty = every model (generic rule)."""
    targets: tuple[RewriteTarget, ...]


@dataclass(frozen=True, slots=True)
class ModelRewrite:
    name: str
    rules: tuple[RewriteRule, ...]
    created: datetime.datetime | None = None
    order: int = 0
    """Declaration order among objects without ``created`` (files)."""

    def sort_key(self) -> tuple[bool, datetime.datetime, int, str]:
        epoch = datetime.datetime.min.replace(tzinfo=datetime.UTC)
        return (self.created is not None, self.created or epoch, self.order, self.name)


@dataclass(frozen=True, slots=True)
class RewriteDecision:
    rewrite_name: str
    target_model: str


@dataclass(frozen=True, slots=True)
class _Choice:
    rewrite_name: str
    models: tuple[str, ...]
    cumulative: tuple[int, ...]
    """Running sum of weights; empty = uniform over ``models``."""

    def draw(self, rng: random.Random) -> str:
        if not self.cumulative:
            return self.models[rng.randrange(len(self.models))]
        point = rng.randrange(self.cumulative[-1])
        for model, bound in zip(self.models, self.cumulative, strict=True):
            if point < bound:
                return model
        return self.models[-1]  # unreachable: point < cumulative[-1]


def _choice(rewrite_name: str, rule: RewriteRule) -> _Choice:
    weighted = [t for t in rule.targets if t.weight]
    if not weighted:
        return _Choice(rewrite_name, tuple(t.model for t in rule.targets), ())
    total = 0
    cumulative = []
    for target in weighted:
        total += target.weight or 0
        cumulative.append(total)
    return _Choice(rewrite_name, tuple(t.model for t in weighted), tuple(cumulative))


class RewriteStore:
    def __init__(self, rewrites: Iterable[ModelRewrite] = ()) -> None:
        self._exact: dict[str, _Choice] = {}
        self._generic: _Choice | None = None
        self._rewrites: tuple[ModelRewrite, ...] = ()
        self.replace(rewrites)

    def replace(self, rewrites: Iterable[ModelRewrite]) -> None:
        ordered = tuple(sorted(rewrites, key=ModelRewrite.sort_key))
        exact: dict[str, _Choice] = {}
        generic: _Choice | None = None
        for rewrite in ordered:  # oldest first: the first claim of a model wins
            for rule in rewrite.rules:
                if not rule.targets:
                    continue
                if not rule.models:
                    generic = generic or _choice(rewrite.name, rule)
                for model in rule.models:
                    if model not in exact:
                        exact[model] = _choice(rewrite.name, rule)
        self._rewrites, self._exact, self._generic = ordered, exact, generic

    def resolve(self, model: str, rng: random.Random) -> RewriteDecision | None:
        """The rewrite for ``model``, or None when no rule matches."""
        choice = self._exact.get(model) or self._generic
        if choice is None:
            return None
        return RewriteDecision(choice.rewrite_name, choice.draw(rng))

    def rewrites(self) -> tuple[ModelRewrite, ...]:
        return self._rewrites

    def __len__(self) -> int:
        return len(self._rewrites)


def target_model(
    request: InferenceRequest,
    parser: Parser,
    parsed: ParseResult,
    body: bytes,
    rewrites: RewriteStore,
    rng: random.Random,
    on_rewrite: Callable[[str, str, str], None],
) -> bytes:
    """Sets ``request.target_model``; returns the body to forward (rewritten if needed).

    Spec §1.7: the ``x-llm-d-model-name-rewrite`` header if present, else the body's model; then
    an InferenceModelRewrite rule matching the *incoming* (body) model overrides it (a generic
    rule also catches a missing model, for parsers that can rewrite the body), the target drawn
    by weight from ``rng``; each such decision is reported to
    ``on_rewrite(rewrite_name, incoming_model, target_model)``."""
    target = wire.first_header(request.headers, wire.MODEL_REWRITE_HEADERS)
    request.target_model = target or parsed.model
    if len(rewrites) and (parsed.model or parser.supports_model_rewrite):
        decision = rewrites.resolve(parsed.model, rng)
        if decision is not None:
            request.target_model = decision.target_model
            on_rewrite(decision.rewrite_name, parsed.model, decision.target_model)
    if parser.supports_model_rewrite and parsed.body.payload is not None:
        if not request.target_model:
            raise InferenceError(ErrorCode.BAD_REQUEST, "model not found in request body")
        if request.target_model != parsed.model:
            return parser.rewrite_model(parsed.body, request.target_model)
    return body


def served_models(endpoints: Sequence[Endpoint], rewrites: RewriteStore) -> list[str]:
    """Model names the pool serves by its own account: LoRA adapters the endpoints' metrics
    list as running or waiting, and every model an InferenceModelRewrite names."""
    names: list[str] = []
    for endpoint in endpoints:
        if endpoint.metrics is not None:
            names += endpoint.metrics.active_models
            names += endpoint.metrics.waiting_models
    for rewrite in rewrites.rewrites():
        for rule in rewrite.rules:
            names += rule.models
            names += (target.model for target in rule.targets)
    return names
