"""InferenceModelRewrite (``llm-d.ai/v1alpha2``, spec §7.3) → ``ModelRewrite``.

Schema::

    spec:
      poolRef: {group?, kind?, name}        # required in the cluster, optional in files
      rules:
      - matches:                            # optional; empty or absent = every model
        - model: {type: Exact, value: <model>}
        targets:                            # at least one
        - modelRewrite: <model>
          weight: 1..1000000                # optional

Resolution (precedence, weighted draw) is ``epp.requestcontrol.rewrites``.
"""

from __future__ import annotations

from typing import Any, Final

from epp.k8s.meta import DecodeError, PoolRef, integer, mapping, metadata, pool_ref, timestamp
from epp.requestcontrol.rewrites import ModelRewrite, RewriteRule, RewriteTarget

GROUP: Final = "llm-d.ai"
VERSION: Final = "v1alpha2"
PLURAL: Final = "inferencemodelrewrites"
KIND: Final = "InferenceModelRewrite"
API_VERSION: Final = f"{GROUP}/{VERSION}"
MAX_WEIGHT: Final = 1_000_000


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise DecodeError(f"{where}: required string")
    return value


def _rule(raw: Any, where: str) -> RewriteRule:
    rule = mapping(raw, where)
    models = []
    for j, m in enumerate(rule.get("matches") or []):
        model = mapping(mapping(m, f"{where}.matches[{j}]").get("model"), f"{where}.matches[{j}]")
        kind = model.get("type", "Exact")
        if kind != "Exact":
            raise DecodeError(f"{where}.matches[{j}].model.type: only Exact is supported")
        models.append(_string(model.get("value"), f"{where}.matches[{j}].model.value"))
    raw_targets = rule.get("targets")
    if not isinstance(raw_targets, list) or not raw_targets:
        raise DecodeError(f"{where}.targets: at least one target required")
    targets = []
    for k, t in enumerate(raw_targets):
        target = mapping(t, f"{where}.targets[{k}]")
        weight = target.get("weight")
        targets.append(
            RewriteTarget(
                model=_string(target.get("modelRewrite"), f"{where}.targets[{k}].modelRewrite"),
                weight=None
                if weight is None
                else integer(weight, f"{where}.targets[{k}].weight", 1, MAX_WEIGHT),
            )
        )
    return RewriteRule(models=tuple(models), targets=tuple(targets))


def decode_rewrite(
    obj: Any, *, require_pool_ref: bool = True, order: int = 0
) -> tuple[PoolRef | None, ModelRewrite]:
    namespace, name, meta = metadata(obj)
    try:
        spec = mapping(obj.get("spec"), "spec")
        ref = pool_ref(spec, required=require_pool_ref)
        raw_rules = spec.get("rules") or []
        if not isinstance(raw_rules, list):
            raise DecodeError("spec.rules: expected a list")
        rules = tuple(_rule(r, f"spec.rules[{i}]") for i, r in enumerate(raw_rules))
        created = timestamp(meta.get("creationTimestamp"), "metadata.creationTimestamp")
    except DecodeError as exc:
        raise DecodeError(f"{KIND} {namespace}/{name}: {exc}") from None
    return ref, ModelRewrite(name=name, rules=rules, created=created, order=order)
