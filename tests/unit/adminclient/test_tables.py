"""The readable tables of ``epp explain`` / ``epp endpoints`` / ``epp state``."""

from __future__ import annotations

from epp._proto import epp_admin_v1_pb2 as pb
from epp.adminclient import tables
from epp.adminclient.cli import _explain_parser, explain_request


def test_explain_table_has_a_column_per_scorer_and_marks_the_target() -> None:
    answer = pb.ExplainResponse(
        outcome="scheduled", request_id="r1", path="/v1/completions", model="m", target_model="m",
        candidates=2, primary_profile="default", destination="10.0.0.2:8000",
        profiles=[pb.ProfileExplain(name="default", targets=["10.0.0.2:8000"], scores=[
            pb.CandidateScore(endpoint="10.0.0.2:8000", total=1.5,
                              scorers={"a/a": 1.0, "b/b": 0.25}),
            pb.CandidateScore(endpoint="10.0.0.1:8000", total=0.5, scorers={"a/a": 0.5}),
        ])],
    )  # fmt: skip
    lines = tables.explain(answer).splitlines()
    header = next(line for line in lines if line.startswith("ENDPOINT"))
    assert header.split() == ["ENDPOINT", "PICKED", "TOTAL", "a/a", "b/b"]
    picked = next(line for line in lines if line.startswith("10.0.0.2"))
    assert picked.split() == ["10.0.0.2:8000", "*", "1.5000", "1.0000", "0.2500"]
    other = next(line for line in lines if line.startswith("10.0.0.1"))
    assert other.split() == ["10.0.0.1:8000", "0.5000", "0.5000", "-"]


def test_a_rejection_shows_status_and_error() -> None:
    answer = pb.ExplainResponse(outcome="rejected", status=400, error="bad body", request_id="r")
    assert "rejected: 400 bad body" in tables.explain(answer)


def test_endpoints_table_shows_never_scraped() -> None:
    out = tables.endpoints(pb.ListEndpointsResponse(endpoints=[pb.EndpointInfo(address="a:1")]))
    assert "never" in out.splitlines()[1]


def test_explain_request_carries_path_headers_and_subset_hint() -> None:
    args = _explain_parser().parse_args(
        ["-d", "{}", "--path", "/v1/chat/completions", "-H", "X-Session-Id: s1",
         "--subset", "10.0.0.1:8000"]
    )  # fmt: skip
    req = explain_request(args)
    assert req.headers[":path"] == "/v1/chat/completions"
    assert req.headers["x-session-id"] == "s1"
    assert req.has_subset_hint and list(req.subset_hint) == ["10.0.0.1:8000"]
    assert not explain_request(_explain_parser().parse_args(["-d", "{}"])).has_subset_hint
