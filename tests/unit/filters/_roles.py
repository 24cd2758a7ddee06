"""Endpoints labelled with every role value, shared by the role filter tests."""

from __future__ import annotations

from epp.plugin import Endpoint
from epp.plugin.roles import ROLE_LABEL
from tests.builders import make_cycle, make_endpoint, make_request

ROLES: list[str | None] = [
    None,  # no label
    "decode",
    "prefill",
    "encode",
    "prefill-decode",
    "both",
    "encode-prefill",
    "encode-prefill-decode",
    "",  # label present, empty
    "Decode",  # values are case-sensitive
    "unknown",
]


def endpoints() -> list[Endpoint]:
    return [
        make_endpoint(i, labels={} if role is None else {ROLE_LABEL: role})
        for i, role in enumerate(ROLES)
    ]


def kept_roles(flt: object) -> list[str | None]:
    eps = endpoints()
    out = flt.filter(make_cycle(), make_request(), eps)  # type: ignore[attr-defined]
    return [ROLES[eps.index(ep)] for ep in out]
