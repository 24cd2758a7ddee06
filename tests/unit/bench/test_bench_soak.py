"""The soak verdict: RSS growth after the warm-up against the 5% limit."""

from __future__ import annotations

import pytest

from epp_tools.bench.soak.cli import epp_args, options
from epp_tools.bench.soak.report import Sample, render, verdict


def _samples(rss: list[float]) -> list[Sample]:
    return [
        Sample(t=60.0 * i, rss_mb=r, fds=20, tasks=25, maps={"sessions": i})
        for i, r in enumerate(rss)
    ]


@pytest.mark.parametrize(
    ("rss", "flat"),
    [
        pytest.param([50, 80, 100, 100, 101, 100, 102, 101, 103, 102], True, id="warm-up-ignored"),
        pytest.param([50, 80, 100, 100, 100, 104, 106, 108, 110, 112], False, id="leak"),
    ],
)
def test_verdict_judges_growth_after_the_warm_up(rss: list[float], flat: bool) -> None:
    assert verdict(_samples(rss))["flat"] is flat


def test_render_shows_every_map_and_the_verdict() -> None:
    samples = _samples([50, 80, 100, 100, 101])
    result = {
        "minutes": 5, "agents": 2, "streams": 3, "requests": 1000, "failed": 0,
        "samples": [s.as_json() for s in samples], "verdict": verdict(samples),
    }  # fmt: skip
    text = render(result)
    assert "| min | RSS MB | fds | asyncio tasks |" in text
    assert "prefix index" in text and "sessions" in text
    assert "(flat, limit 5%)" in text


def test_the_epp_runs_with_experimental_plugins_and_the_removed_server_option_is_refused() -> None:
    assert epp_args(options([])) == ["--allow-experimental-plugins"]
    with pytest.raises(SystemExit):
        options(["--ext-proc-server", "h2"])
