"""The fuzzer's own parts: reproducible cases, Envoy's waiting rules, the reply checks."""

from __future__ import annotations

from epp._proto import epp_extproc_v3_pb2 as pb
from epp_tools.bench.fuzz.drive import ANY, check_replies, demand
from epp_tools.bench.fuzz.gen import DUPLEX, MODE, Spec
from epp_tools.bench.fuzz.mutate import MUTATIONS, make_case
from epp_tools.bench.fuzz.run import case_rng, fuzz_config_body

SPEC = Spec(pool=("127.0.0.1:1", "127.0.0.1:2"))


def test_a_case_is_reproduced_by_its_seed_and_index() -> None:
    a = make_case(case_rng(7, 42), SPEC)
    b = make_case(case_rng(7, 42), SPEC)
    assert [s.data for s in a.steps] == [s.data for s in b.steps] and a.tags == b.tags
    assert [s.data for s in make_case(case_rng(7, 43), SPEC).steps] != [s.data for s in a.steps]


def test_every_mutation_and_ending_shows_up_in_a_few_hundred_cases() -> None:
    tags: set[str] = set()
    legal = 0
    for i in range(400):
        case = make_case(case_rng(1, i), SPEC)
        tags.update(case.tags)
        legal += case.legal
    assert set(MUTATIONS) | {"cancel", "half_close", "over-limit", "nested"} <= tags
    assert 100 < legal < 300


def test_envoy_waits_as_the_body_mode_says() -> None:
    headers = pb.ProcessingRequest(request_headers=pb.HttpHeaders())
    eos_body = pb.ProcessingRequest(request_body=pb.HttpBody(end_of_stream=True))
    chunk = pb.ProcessingRequest(response_body=pb.HttpBody())
    assert demand(headers, DUPLEX, DUPLEX) is None
    assert demand(headers, MODE.BUFFERED, DUPLEX) == "request_headers"
    assert demand(eos_body, DUPLEX, DUPLEX) == "request_body"
    assert demand(chunk, DUPLEX, DUPLEX) is None
    assert demand(chunk, DUPLEX, MODE.STREAMED) == "response_body"
    assert demand(pb.ProcessingRequest(), DUPLEX, DUPLEX) == ANY
    assert demand(None, DUPLEX, DUPLEX) == ANY


def _headers_reply(sets: dict[str, str], remove: list[str]) -> pb.ProcessingResponse:
    mutation = pb.HeaderMutation(
        set_headers=[
            pb.HeaderValueOption(header=pb.HeaderValue(key=k, raw_value=v.encode()))
            for k, v in sets.items()
        ],
        remove_headers=remove,
    )
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=mutation))
    )


def test_reply_checks_find_leaks_and_routes_outside_the_pool() -> None:
    spoofed = {"x-gateway-destination-endpoint": "10.6.6.6:1", "x-prefiller-host-port": "h:1"}
    good = _headers_reply(
        {"x-gateway-destination-endpoint": "127.0.0.1:1"}, ["x-prefiller-host-port"]
    )
    assert check_replies([good], spoofed, SPEC.pool) is None
    kept = _headers_reply({"x-gateway-destination-endpoint": "127.0.0.1:1"}, [])
    assert check_replies([kept], spoofed, SPEC.pool) == (
        "leak",
        "request_headers reply lets the client's x-prefiller-host-port through",
    )
    outside = _headers_reply({"x-gateway-destination-endpoint": "10.6.6.6:1"}, [])
    assert check_replies([outside], {}, SPEC.pool) is not None
    assert check_replies([outside], {}, SPEC.pool)[0] == "bad_route"  # type: ignore[index]


def test_the_fuzz_config_routes_every_path_the_generator_uses() -> None:
    body = fuzz_config_body()
    for parser in ("openai-parser", "anthropic-parser", "vllmhttp-parser", "passthrough-parser"):
        assert f"pluginRef: {parser}" in body
