"""The role filters' shared body: keep the endpoints whose ``llm-d.ai/role`` serves a stage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.plugin import CycleState, Endpoint, InferenceRequest, PluginBase
from epp.plugin.roles import serves


class RoleFilter(PluginBase):
    """Keeps the endpoints ``epp.plugin.roles.serves`` accepts for ``ROLES``, in input order."""

    ROLES: ClassVar[frozenset[str]] = frozenset()

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        roles = self.ROLES
        return [ep for ep in endpoints if serves(ep, roles)]
