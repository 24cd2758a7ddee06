"""InferenceObjective (``llm-d.ai/v1alpha2``; legacy ``inference.networking.x-k8s.io/v1alpha2``).

Decoded fields (spec §7.2): ``spec.priority`` (optional int32; unset = 0; negative = sheddable)
and ``spec.poolRef`` (required in the cluster; optional in files). A request selects an objective
by name with the ``x-llm-d-inference-objective`` header; only objectives whose poolRef names this
EPP's pool (name and group) count, keyed by name.

When both API groups are installed, the legacy group is not watched at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from epp.k8s.meta import DecodeError, PoolRef, integer, mapping, metadata, pool_ref

GROUP: Final = "llm-d.ai"
LEGACY_GROUP: Final = "inference.networking.x-k8s.io"
VERSION: Final = "v1alpha2"
PLURAL: Final = "inferenceobjectives"
KIND: Final = "InferenceObjective"
API_VERSIONS: Final = (f"{GROUP}/{VERSION}", f"{LEGACY_GROUP}/{VERSION}")
_INT32: Final = (-(2**31), 2**31 - 1)


@dataclass(frozen=True, slots=True)
class Objective:
    name: str
    namespace: str
    priority: int | None
    pool_ref: PoolRef | None


def decode_objective(obj: Any, *, require_pool_ref: bool = True) -> Objective:
    namespace, name, _ = metadata(obj)
    try:
        spec = mapping(obj.get("spec") or {}, "spec")
        raw = spec.get("priority")
        priority = None if raw is None else integer(raw, "spec.priority", *_INT32)
        ref = pool_ref(spec, required=require_pool_ref)
    except DecodeError as exc:
        raise DecodeError(f"{KIND} {namespace}/{name}: {exc}") from None
    return Objective(name=name, namespace=namespace, priority=priority, pool_ref=ref)


def priorities(
    objectives: Iterable[Objective], pool_name: str = "", pool_group: str = ""
) -> dict[str, int]:
    """name → priority for the objectives of this pool (no pool name: every objective)."""
    return {
        o.name: o.priority or 0
        for o in objectives
        if not pool_name or o.pool_ref is None or o.pool_ref.selects(pool_name, pool_group)
    }
