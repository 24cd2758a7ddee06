from __future__ import annotations

import pytest

from epp.plugin import ProfileResult, SchedulingResult
from epp.plugin.roles import (
    DECODE_ROLES,
    ENCODE_ROLES,
    PREFILL_ROLES,
    ROLE_LABEL,
    role_of,
    serves,
    write_disagg_headers,
)
from tests.builders import make_endpoint, make_request


def test_role_sets_are_upstreams() -> None:
    # pkg/epp/framework/plugins/scheduling/filter/bylabel/roles.go; "" = no label (decode only).
    decode = {"decode", "prefill-decode", "both", "encode-prefill-decode", ""}
    prefill = {"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"}
    encode = {"encode", "encode-prefill", "encode-prefill-decode"}
    assert (decode, prefill, encode) == (DECODE_ROLES, PREFILL_ROLES, ENCODE_ROLES)
    assert ROLE_LABEL == "llm-d.ai/role"


def test_unlabeled_and_empty_label_read_alike_but_only_unlabeled_serves_decode() -> None:
    unlabeled = make_endpoint(0)
    empty = make_endpoint(1, labels={ROLE_LABEL: ""})
    assert role_of(unlabeled) == role_of(empty) == ""
    assert serves(unlabeled, DECODE_ROLES)
    assert not serves(empty, DECODE_ROLES)  # upstream: label defined, value not valid
    assert not serves(unlabeled, PREFILL_ROLES)
    assert not serves(make_endpoint(2, labels={ROLE_LABEL: "unknown"}), DECODE_ROLES)


def test_write_disagg_headers_sets_both_and_clears_stale_values() -> None:
    d, p, e1, e2 = (make_endpoint(i) for i in range(4))
    request = make_request()
    result = SchedulingResult(
        {
            "decode": ProfileResult((d,)),
            "prefill": ProfileResult((p, d)),
            "encode": ProfileResult((e1, e2)),
        },
        "decode",
    )
    write_disagg_headers(request, result, prefill_profile="prefill", encode_profile="encode")
    assert request.upstream_headers == {
        "x-prefiller-host-port": "192.168.1.2:8000",
        "x-encoder-hosts-ports": "192.168.1.3:8000,192.168.1.4:8000",
    }
    decode_only = SchedulingResult({"decode": ProfileResult((d,))}, "decode")
    write_disagg_headers(request, decode_only, prefill_profile="prefill", encode_profile="encode")
    assert request.upstream_headers == {}


def test_write_disagg_headers_brackets_ipv6() -> None:
    request = make_request()
    p = make_endpoint(0, address="fd00::1", port=8200)
    result = SchedulingResult({"d": ProfileResult((p,)), "p": ProfileResult((p,))}, "d")
    write_disagg_headers(request, result, prefill_profile="p", encode_profile="e")
    assert request.upstream_headers == {"x-prefiller-host-port": "[fd00::1]:8200"}


@pytest.mark.parametrize("profile", ["prefill", "encode"])
def test_stage_with_empty_targets_sets_no_header(profile: str) -> None:
    request = make_request()
    d = make_endpoint(0)
    result = SchedulingResult({"decode": ProfileResult((d,)), profile: ProfileResult(())}, "decode")
    write_disagg_headers(request, result, prefill_profile="prefill", encode_profile="encode")
    assert request.upstream_headers == {}
