from __future__ import annotations

import pytest

from epp.plugin import ProfileResult, RequestBody, SchedulingResult
from epp.plugin.multimodal import media_summary
from epp.plugin.roles import (
    DECODE_ROLES,
    ENCODE_ROLES,
    PREFILL_ROLES,
    ROLE_LABEL,
    role_of,
    serves,
    write_disagg_headers,
)
from epp.plugin.spans import SPAN_SINK
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


class _Sink:
    def __init__(self) -> None:
        self.spans: list[tuple[str, int, int, dict[str, object]]] = []

    def add_span(self, name: str, start_ns: int, end_ns: int, attributes: object) -> None:
        self.spans.append((name, start_ns, end_ns, dict(attributes)))  # type: ignore[call-overload]


def test_traced_request_gets_upstreams_prepare_disaggregation_span() -> None:
    d, p = make_endpoint(0), make_endpoint(1)
    sink = _Sink()
    chat = {"messages": [{"content": [{"type": "input_audio", "input_audio": {"data": "x"}}]}]}
    request = make_request(
        target_model="m", body=RequestBody("chat", chat, b""), attributes={SPAN_SINK: sink}
    )
    stages = {"decode": (d,), "prefill": (p,), "encode": ()}
    result = SchedulingResult({k: ProfileResult(v) for k, v in stages.items()}, "decode")
    write_disagg_headers(request, result, prefill_profile="prefill", encode_profile="encode")
    ((name, start, end, attributes),) = sink.spans
    assert name == "prepare_disaggregation" and 0 < start <= end
    assert attributes == {
        "gen_ai.request.model": "m",
        "gen_ai.request.id": "req-0",
        "mm.modality": "audio",
        "mm.hash_count": 1,
        "llm_d.epp.pd.disaggregation_used": True,
        "llm_d.epp.pd.prefill_pod_address": "192.168.1.2",
        "llm_d.epp.pd.prefill_pod_port": "8000",
        "llm_d.epp.encode.disaggregation_used": False,
        "llm_d.epp.encode.reason": "no_encode_profile_target_endpoints",
    }
    untraced = make_request()
    write_disagg_headers(untraced, result, prefill_profile="none", encode_profile="encode")
    assert len(sink.spans) == 1  # no sink, no span


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param("just text", ("none", 0), id="text"),
        pytest.param(
            [
                {"type": "image_url", "image_url": {"url": "a"}},
                {"type": "video_url", "video_url": {"url": "b"}},
                {"type": "image_url", "image_url": "a"},
            ],
            ("image,video", 3),
            id="mixed",
        ),
    ],
)
def test_media_summary_is_upstreams_mm_modality_and_hash_count(
    content: object, expected: tuple[str, int]
) -> None:
    body = RequestBody("chat", {"messages": [{"role": "user", "content": content}]}, b"")
    assert media_summary(body) == expected
