"""``epp bench engines``, run tiny: every engine serves the echo call and the whole EPP's
chunks and requests, and the table shows each with its ratio to the hand-written baseline."""

from __future__ import annotations

import pytest

from epp_tools.bench.cli import SUBCOMMANDS
from epp_tools.bench.engines import cli as engines
from epp_tools.bench.micro import chunkcost


def test_engines_run_tiny_and_print_every_engine_with_its_ratio() -> None:
    printed: list[str] = []
    assert (
        engines.main(["--chunks", "200", "--requests", "20", "--rounds", "1"], printed.append) == 0
    )
    (text,) = printed
    lines = text.splitlines()[3:]
    assert len(lines) == 3 * len(engines.ENGINES)
    for step in (engines.ECHO, engines.CHUNK, engines.REQUEST):
        rows = [line.split() for line in lines if line.startswith(step)]
        assert [r[-3] for r in rows] == list(engines.ENGINES)
        assert all(float(r[-2]) > 0.0 for r in rows)
        assert rows[-1][-1] == "1.00"  # the baseline against itself
    assert SUBCOMMANDS["engines"] == "epp_tools.bench.engines.cli"


@pytest.mark.parametrize("name", list(engines.ENGINES))
async def test_each_engine_answers_every_echoed_message(name: str) -> None:
    transport_total = []

    class Counting(chunkcost.CountingTransport):
        def write(self, data: bytes) -> None:
            super().write(data)
            transport_total.append(len(data))

    conn = engines.ENGINES[name](lambda path, io: engines._Echo(io, b"r" * 60), 1 << 20, print)
    conn.connection_made(Counting())
    conn.data_received(chunkcost.Client.preface())
    client = chunkcost.Client()
    conn.data_received(client.headers(1))
    before = sum(transport_total)
    for _ in range(10):
        conn.data_received(client.message(1, b"m" * 120))
    assert sum(transport_total) - before >= 10 * (9 + 5 + 60)  # a DATA frame per reply at least
    assert engines.echo_us(engines.ENGINES[name], 100) > 0.0


def test_the_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        engines.main(["--rounds", "0"])
