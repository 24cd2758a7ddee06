"""Kubernetes label selectors: ``matchLabels`` maps and the string syntax of ``--endpoint-selector``
and of plugin parameters (``disaggregatedset-rollout-screener``'s ``scope.labelSelector``).

String syntax (as ``kubectl -l``), requirements separated by commas, all must hold::

    app=vllm            key equals value (also ``==``)
    tier!=batch         key absent or different
    role in (decode,both)   /  role notin (prefill)
    gpu                 key present
    !canary             key absent

A malformed selector raises ``ValueError`` at startup.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

_KEY: Final = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE: Final = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_RE: Final = re.compile(rf"^({_KEY})\s+(in|notin)\s+\(([^)]*)\)$")
_EQ_RE: Final = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_EXISTS_RE: Final = re.compile(rf"^(!?)\s*({_KEY})$")

Predicate = Callable[[Mapping[str, str]], bool]


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str
    """One of ``=``, ``!=``, ``in``, ``notin``, ``exists``, ``!``."""
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "exists":
            return value is not None
        if self.op == "!":
            return value is None
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        return value is None or value not in self.values  # != and notin


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @classmethod
    def from_match_labels(cls, match_labels: Mapping[str, str]) -> LabelSelector:
        return cls(
            tuple(Requirement(k, "=", frozenset({v})) for k, v in sorted(match_labels.items()))
        )


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return parts


def parse_selector(text: str) -> LabelSelector:
    if not text.strip():
        raise ValueError("empty label selector")
    requirements = []
    for part in _split(text):
        if m := _SET_RE.match(part):
            values = frozenset(v.strip() for v in m.group(4).split(",") if v.strip())
            if not values:
                raise ValueError(f"label selector {text!r}: {part!r} lists no values")
            requirements.append(Requirement(m.group(1), m.group(3), values))
        elif m := _EQ_RE.match(part):
            op = "!=" if m.group(3) == "!=" else "="
            requirements.append(Requirement(m.group(1), op, frozenset({m.group(4)})))
        elif m := _EXISTS_RE.match(part):
            requirements.append(Requirement(m.group(2), "!" if m.group(1) else "exists"))
        else:
            raise ValueError(f"label selector {text!r}: cannot parse {part!r}")
    return LabelSelector(tuple(requirements))
