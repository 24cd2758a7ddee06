"""Decoding helpers shared by the Kubernetes object decoders.

Every decoder turns a raw JSON object (a dict, as the API server or a YAML file gives it) into a
frozen value, or raises ``DecodeError`` naming the object and the field. The watch loop logs and
skips objects that fail to decode; the file loader rejects the file.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

POOL_GROUP: Final = "inference.networking.k8s.io"
POOL_KIND: Final = "InferencePool"


class DecodeError(ValueError):
    """An object does not have the expected shape."""


@dataclass(frozen=True, slots=True)
class PoolRef:
    """``spec.poolRef`` of an InferenceObjective or InferenceModelRewrite."""

    name: str
    group: str = POOL_GROUP
    kind: str = POOL_KIND

    def selects(self, pool_name: str, pool_group: str) -> bool:
        return self.name == pool_name and self.group == pool_group


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise DecodeError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def metadata(obj: Any) -> tuple[str, str, Mapping[str, Any]]:
    """(namespace, name, metadata) of an object; the namespace defaults to ``default``."""
    meta = mapping(mapping(obj, "object").get("metadata"), "metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise DecodeError("metadata.name: required")
    namespace = meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        raise DecodeError(f"{name}: metadata.namespace must be a string")
    return namespace, name, meta


def object_key(obj: Any) -> str:
    """``<namespace>/<name>``; raises DecodeError without a name."""
    namespace, name, _ = metadata(obj)
    return f"{namespace}/{name}"


def string_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    m = mapping(value, where)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
        raise DecodeError(f"{where}: must map strings to strings")
    return dict(m)


def integer(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DecodeError(f"{where}: expected an integer, got {value!r}")
    if not low <= value <= high:
        raise DecodeError(f"{where}: {value} is out of range {low}..{high}")
    return value


def timestamp(value: Any, where: str) -> datetime.datetime | None:
    """RFC 3339 time (a string from the API server, a datetime from YAML), or None."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime.datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise DecodeError(f"{where}: not an RFC 3339 time: {value!r}") from None
    else:
        raise DecodeError(f"{where}: not an RFC 3339 time: {value!r}")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def pool_ref(spec: Mapping[str, Any], *, required: bool) -> PoolRef | None:
    """``spec.poolRef``: ``name`` required, ``group``/``kind`` defaulted as in the CRDs."""
    value = spec.get("poolRef")
    if value is None:
        if required:
            raise DecodeError("spec.poolRef: required")
        return None
    ref = mapping(value, "spec.poolRef")
    name = ref.get("name")
    if not isinstance(name, str) or not name:
        raise DecodeError("spec.poolRef.name: required")
    group = ref.get("group", POOL_GROUP)
    kind = ref.get("kind", POOL_KIND)
    if not isinstance(group, str) or not isinstance(kind, str):
        raise DecodeError("spec.poolRef: group and kind must be strings")
    return PoolRef(name=name, group=group or POOL_GROUP, kind=kind or POOL_KIND)
