"""What a filter, scorer or picker must declare: the one definition that start-up (the config
loader placing a plugin in a scheduling profile) and the contract kit (``epp.plugin.testing``)
both apply, so a plugin the kit passes is never refused at start-up, and the reverse.

A role's members are those of its Protocol in ``protocols`` (``typed_name``, the method, and for
a scorer the class attribute ``category``); a scorer's ``category`` must be a ``ScorerCategory``
(``AFFINITY``, ``DISTRIBUTION`` or ``BALANCE``: how the scheduler's weights treat it, as
upstream). ``problems`` names what is missing, for the error message.
"""

from __future__ import annotations

import typing
from typing import Any, Final

from epp.plugin.protocols import Filter, Picker, Scorer
from epp.plugin.types import ScorerCategory

SCHEDULING_ROLES: Final = {"filter": Filter, "scorer": Scorer, "picker": Picker}
_CATEGORY_HINT: Final = " (a class attribute: ScorerCategory.AFFINITY, DISTRIBUTION or BALANCE)"


def members(role: type) -> frozenset[str]:
    """The attributes and methods a runtime-checkable Protocol requires."""
    attrs = getattr(role, "__protocol_attrs__", None)
    if attrs is None:  # Python < 3.12
        attrs = typing._get_protocol_attrs(role)  # type: ignore[attr-defined]
    return frozenset(attrs)


def problems(obj: Any, role: str) -> list[str]:
    """Why ``obj`` is not a ``role`` (``filter``, ``scorer``, ``picker``); empty when it is."""
    out = [
        f"missing `{m}`" + (_CATEGORY_HINT if m == "category" else "")
        for m in sorted(members(SCHEDULING_ROLES[role]))
        if not hasattr(obj, m)
    ]
    category = getattr(obj, "category", None)
    if role == "scorer" and category is not None and not isinstance(category, ScorerCategory):
        out.append(f"`category` is {category!r}, not a ScorerCategory")
    return out


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
