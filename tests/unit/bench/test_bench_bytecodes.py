"""``python -m epp_tools.bench.micro.bytecodes``: the bytecodes per chunk and per request, by
function, on a whole EPP in process."""

from __future__ import annotations

import pytest

from epp_tools.bench.micro import bytecodes


@pytest.fixture(scope="module")
def counts() -> tuple[bytecodes.Counts, bytecodes.Counts]:
    return bytecodes.measure(chunks=60, requests=20)


def test_a_chunk_is_counted_through_the_server_and_the_director(
    counts: tuple[bytecodes.Counts, bytecodes.Counts],
) -> None:
    chunk, _ = counts
    sites = set(chunk.bytecodes)
    for site in (
        ("epp/server/h2conn.py", "data_received"),
        ("epp/server/messages.py", "response_chunk"),
        ("epp/server/stream.py", "response_chunk"),
        ("epp/requestcontrol/responses.py", "on_response_chunk"),
    ):
        assert site in sites, site
        assert chunk.calls[site] == chunk.units  # once per chunk, not per run
    # the feeding loop is not the EPP's work
    assert not any(file.endswith("bytecodes.py") for file, _ in sites)
    assert 100 < chunk.bytecodes_per_unit < 5_000
    assert chunk.calls_per_unit >= 10


def test_a_request_costs_more_than_a_chunk_and_routes(
    counts: tuple[bytecodes.Counts, bytecodes.Counts],
) -> None:
    chunk, request = counts
    assert request.bytecodes_per_unit > 5 * chunk.bytecodes_per_unit
    assert any(file == "epp/scheduling/scheduler.py" for file, _ in request.bytecodes)
    by_file = request.by_file()
    assert sum(by_file.values()) == sum(request.bytecodes.values())


def test_the_tables_list_the_top_functions_and_files(
    counts: tuple[bytecodes.Counts, bytecodes.Counts],
) -> None:
    chunk, _ = counts
    lines = bytecodes.table("per streamed chunk", chunk, top=3)
    assert lines[0].startswith("per streamed chunk: ")
    assert sum(1 for line in lines if line.startswith("| ") and ".py" in line) == 6


def test_counts_below_one_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bytecodes.main(["--chunks", "0"])
    assert "at least 1" in capsys.readouterr().err
