"""What a plugin must declare to fill a role: the one definition that start-up (the config loader
slotting a plugin into a scheduling profile, the parser list, the saturation detector, a data
source and its extractors; the pipeline slotting screeners, producers and hooks) and the
contract kit (``epp.plugin.testing``) both apply, so a plugin the kit passes is never refused at
start-up, and the reverse.

A role's members are those of its Protocol (``protocols``, ``flow``, ``sharing``): ``typed_name``,
its methods, and class attributes such as a scorer's ``category`` or a parser's
``supports_model_rewrite``. Beyond members, start-up relies on:

- a scorer's ``category`` is a ``ScorerCategory`` (``AFFINITY``, ``DISTRIBUTION`` or ``BALANCE``:
  how the scheduler's weights treat it, as upstream);
- a parser's ``supports_model_rewrite`` is a ``bool`` and ``claims()`` a tuple of path suffixes;
- a producer's ``produces()`` is a non-empty set of keys ``<data type>/<its own name>`` (the
  loader matches consumers to producers by that name); a consumer's ``consumes()`` is a set of
  ``<data type>/<producer>`` keys;
- a ``ProducerTimeout`` is a positive number of seconds.

``problems`` names what is missing or wrong, for the error message; ``refusals`` is what the
loader applies to every configured plugin, for each role whose members it has (so a producer
with a foreign key is refused at start-up, as the kit refuses it).
"""

from __future__ import annotations

import typing
from typing import Any, Final

from epp.plugin.capabilities import ProducerTimeout
from epp.plugin.flow import (
    EvictionFilterPolicy,
    EvictionOrderingPolicy,
    FairnessPolicy,
    OrderingPolicy,
    PriorityAdjuster,
    UsageLimitPolicy,
)
from epp.plugin.notifications import NotificationExtractor, NotificationSource
from epp.plugin.protocols import (
    Admitter,
    Consumer,
    DataProducer,
    DataSource,
    Decider,
    Discovery,
    EndpointExtractor,
    EndpointSource,
    Extractor,
    Filter,
    Parser,
    Picker,
    PreRequest,
    ProfileHandler,
    RequestHeaderProcessor,
    ResponseComplete,
    ResponseHeaders,
    ResponseStreaming,
    SaturationDetector,
    Scorer,
    Screener,
)
from epp.plugin.sharing import ReplicaSyncer, SharedState
from epp.plugin.types import ScorerCategory

SCHEDULING_ROLES: Final = {"filter": Filter, "scorer": Scorer, "picker": Picker}
ROLES: Final[dict[str, type]] = {
    **SCHEDULING_ROLES,
    "parser": Parser,
    "producer": DataProducer,
    "consumer": Consumer,
    "data-source": DataSource,
    "extractor": Extractor,
    "endpoint-source": EndpointSource,
    "endpoint-extractor": EndpointExtractor,
    "notification-source": NotificationSource,
    "notification-extractor": NotificationExtractor,
    "discovery": Discovery,
    "screener": Screener,
    "admitter": Admitter,
    "saturation-detector": SaturationDetector,
    "profile-handler": ProfileHandler,
    "decider": Decider,
    "request-header": RequestHeaderProcessor,
    "pre-request": PreRequest,
    "response-headers": ResponseHeaders,
    "response-streaming": ResponseStreaming,
    "response-complete": ResponseComplete,
    "ordering-policy": OrderingPolicy,
    "fairness-policy": FairnessPolicy,
    "usage-limit-policy": UsageLimitPolicy,
    "priority-adjuster": PriorityAdjuster,
    "eviction-filter-policy": EvictionFilterPolicy,
    "eviction-ordering-policy": EvictionOrderingPolicy,
    "shared-state": SharedState,
    "replica-syncer": ReplicaSyncer,
}
"""Every role a plugin can fill, by the name used in messages."""
_CATEGORY_HINT: Final = " (a class attribute: ScorerCategory.AFFINITY, DISTRIBUTION or BALANCE)"


def members(role: type) -> frozenset[str]:
    """The attributes and methods a runtime-checkable Protocol requires."""
    attrs = getattr(role, "__protocol_attrs__", None)
    if attrs is None:  # Python < 3.12
        attrs = typing._get_protocol_attrs(role)  # type: ignore[attr-defined]
    return frozenset(attrs)


def problems(obj: Any, role: str) -> list[str]:
    """Why ``obj`` is not a ``role`` (a key of ``ROLES``); empty when it is."""
    out = [
        f"missing `{m}`" + (_CATEGORY_HINT if m == "category" else "")
        for m in sorted(members(ROLES[role]))
        if not hasattr(obj, m)
    ]
    if out:
        return out
    return _declarations(obj, role)


def _declarations(obj: Any, role: str) -> list[str]:
    """The rules beyond members, for a ``role`` whose members ``obj`` has."""
    if role == "scorer" and not isinstance(obj.category, ScorerCategory):
        return [f"`category` is {obj.category!r}, not a ScorerCategory"]
    if role == "parser":
        return _parser_problems(obj)
    if role == "producer":
        return _producer_problems(obj)
    if role == "consumer":
        keys = obj.consumes()
        bad = [k for k in _as_set(keys) if not _is_key(k)]
        if not isinstance(keys, (set, frozenset)) or bad:
            return [f"consumes() must be a set of '<data type>/<producer>' keys, got {keys!r}"]
    return []


def _parser_problems(obj: Any) -> list[str]:
    out = []
    if not isinstance(obj.supports_model_rewrite, bool):
        out.append(f"`supports_model_rewrite` is {obj.supports_model_rewrite!r}, not a bool")
    claims = obj.claims()
    if not isinstance(claims, tuple) or not all(isinstance(c, str) and c for c in claims):
        out.append(f"claims() must be a tuple of path suffixes, got {claims!r}")
    return out


def _producer_problems(obj: Any) -> list[str]:
    out = []
    keys = obj.produces()
    name = obj.typed_name.name
    if not isinstance(keys, (set, frozenset)) or not keys:
        out.append(f"produces() must be a non-empty set of data keys, got {keys!r}")
    else:
        for key in sorted(keys):
            if not _is_key(key) or key.partition("/")[2] != name:
                out.append(f"produces() key {key!r} is not '<data type>/{name}'")
    if isinstance(obj, ProducerTimeout):
        timeout = obj.produce_timeout()
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            out.append(f"produce_timeout() is {timeout!r}, not a positive number of seconds")
    return out


def _as_set(keys: Any) -> list[Any]:
    return list(keys) if isinstance(keys, (set, frozenset)) else []


def _is_key(key: Any) -> bool:
    data_type, sep, producer = key.partition("/") if isinstance(key, str) else ("", "", "")
    return bool(data_type and sep and producer)


def slotted_roles(obj: Any) -> list[str]:
    """The roles whose members ``obj`` has: where start-up would slot it (if it declares them
    right; ``refusals`` says what it declares wrongly)."""
    return [role for role, proto in ROLES.items() if all(hasattr(obj, m) for m in members(proto))]


def refusals(obj: Any) -> dict[str, list[str]]:
    """For each role whose members ``obj`` has (so start-up would slot it there), what it declares
    wrongly; empty when nothing. Start-up refuses a plugin with any."""
    out = {}
    for role in slotted_roles(obj):
        wrong = _declarations(obj, role)
        if wrong:
            out[role] = wrong
    return out


def roles_of(obj: Any) -> list[str]:
    """Every role ``obj`` fully implements."""
    return [role for role in ROLES if not problems(obj, role)]


def scheduling_roles(obj: Any) -> list[str]:
    """The scheduling roles ``obj`` fully implements."""
    return [role for role in SCHEDULING_ROLES if not problems(obj, role)]


def explain_refusal(obj: Any) -> str:
    """Why ``obj`` is none of filter, scorer, picker: for each role whose method it has, what it
    still lacks (``""`` when it has no scheduling method at all)."""
    methods = {"filter": "filter", "scorer": "score", "picker": "pick"}
    reasons = [
        f"as a {role}: {'; '.join(problems(obj, role))}"
        for role, method in methods.items()
        if hasattr(obj, method) and problems(obj, role)
    ]
    return "; ".join(reasons)
