"""Parameters of ``disaggregatedset-rollout-screener`` (the reference is that module's docstring),
checked as upstream checks them, with its messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from epp.plugin.selectors import parse_selector

DEFAULT_REVISION_LABEL: Final = "disaggregatedset.x-k8s.io/revision"
DEFAULT_ROLE_LABEL: Final = "disaggregatedset.x-k8s.io/role"
STRICT: Final = "strict"
PREFER: Final = "prefer"


@dataclass(frozen=True)
class Scope:
    label_selector: str = ""


@dataclass(frozen=True)
class HeaderSelector:
    name: str = ""
    header_name: str = ""
    label_key: str = ""
    mode: str = ""

    def problem(self, index: int) -> str | None:
        for key, value in (("name", self.name), ("headerName", self.header_name)):
            if not value:
                return f"headerSelectors[{index}].{key} is required"
        if not self.label_key:
            return f"headerSelectors[{index}].labelKey is required"
        if self.mode not in (STRICT, PREFER):
            return f"headerSelectors[{index}].mode {self.mode!r} must be one of strict|prefer"
        return None


@dataclass(frozen=True)
class RequireRoles:
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class RevisionGating:
    mode: str = ""
    require_roles: RequireRoles | None = None
    revision_label_key: str = ""
    role_label_key: str = ""

    def problem(self) -> str | None:
        if self.mode == "disabled":
            return None
        if self.mode not in ("sum", "max-role"):
            return f"revisionGating.mode {self.mode!r} must be one of sum|max-role|disabled"
        if self.require_roles is None:
            return f"revisionGating.requireRoles is required when revisionGating.mode={self.mode}"
        roles = self.require_roles.values
        if not roles:
            return "revisionGating.requireRoles.values must contain at least one role"
        for i, role in enumerate(roles):
            if not role:
                return f"revisionGating.requireRoles.values[{i}] must not be empty"
            if role in roles[:i]:
                return f"revisionGating.requireRoles.values contains duplicate role {role!r}"
        return None

    @property
    def active(self) -> bool:
        """Coverage checks and weighted revision choice are on (``sum`` or ``max-role``)."""
        return self.mode != "disabled"

    @property
    def revision_label(self) -> str:
        return self.revision_label_key or DEFAULT_REVISION_LABEL

    @property
    def role_label(self) -> str:
        return self.role_label_key or DEFAULT_ROLE_LABEL


@dataclass(frozen=True)
class RolloutParams:
    scope: Scope = field(default_factory=Scope)
    header_selectors: tuple[HeaderSelector, ...] = ()
    revision_gating: RevisionGating | None = None

    def __post_init__(self) -> None:
        if not self.scope.label_selector:
            raise ValueError("scope.labelSelector is required")
        try:
            parse_selector(self.scope.label_selector)
        except ValueError as exc:
            raise ValueError(f"scope.labelSelector is not a valid label selector: {exc}") from None
        self._check_selectors()
        if self.revision_gating is None:
            raise ValueError("revisionGating is required")
        problem = self.revision_gating.problem()
        if problem:
            raise ValueError(problem)

    def _check_selectors(self) -> None:
        names: set[str] = set()
        headers: set[str] = set()
        for i, selector in enumerate(self.header_selectors):
            problem = selector.problem(i)
            if problem:
                raise ValueError(problem)
            if selector.name in names:
                raise ValueError(f"headerSelectors: duplicate name {selector.name!r}")
            header = selector.header_name.lower()
            if header in headers:
                raise ValueError(f"headerSelectors: duplicate headerName {header!r}")
            names.add(selector.name)
            headers.add(header)
