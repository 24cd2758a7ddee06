"""``LineCache.parse`` gives what ``parse`` gives, on real pages and on every edge of the syntax,
whether its lines were seen before or not."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from epp.plugins.sources.engines import build_registry
from epp.plugins.sources.promtext import Families, LineCache, Sample, parse
from epp_tools.sim.config import PodConfig
from epp_tools.sim.control import Overrides
from epp_tools.sim.engine import Engine
from epp_tools.sim.metrics import MetricsRenderer

TESTDATA = Path(__file__).parent / "testdata"
GOLDEN = ["vllm.prom", "sglang.prom", "trtllm.prom", "triton-tensorrt-llm.prom", "triton.prom"]


def _same(cached: Families, plain: Families) -> None:
    """Equal samples per series in payload order, and the same count of skipped lines (NaN
    compared as NaN)."""
    assert cached.keys() == plain.keys()
    for name, samples in plain.items():
        got = cached[name]
        assert [(s.name, s.labels, s.timestamp_ms) for s in got] == [
            (s.name, s.labels, s.timestamp_ms) for s in samples
        ]
        for a, b in zip(got, samples, strict=True):
            assert a.value == b.value or (math.isnan(a.value) and math.isnan(b.value))
    assert cached.skipped == plain.skipped


def _twice(cache: LineCache, payload: bytes, wanted: frozenset[str]) -> None:
    """Cold (lines unseen) and warm (every line cached) both equal the plain parse."""
    plain = parse(payload, wanted)
    _same(cache.parse(payload, wanted), plain)
    _same(cache.parse(payload, wanted), plain)


def _sim_page(engine: str) -> bytes:
    config = PodConfig(engine=engine)  # type: ignore[arg-type]
    sim = Engine(config)
    sim.add_request("r", list(range(1, 40)), 4, 0.0)
    sim.advance(0.0)
    return MetricsRenderer(config).render(sim, Overrides(), 100.0).encode()


@pytest.mark.parametrize("name", GOLDEN)
def test_cache_equals_parse_when_reading_golden_scrapes(name: str) -> None:
    payload = (TESTDATA / name).read_bytes()
    every_series = frozenset(parse(payload))
    _twice(LineCache(), payload, every_series)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_cache_equals_parse_when_reading_simulator_pages(engine: str) -> None:
    payload = _sim_page(engine)
    registry, _ = build_registry((), "vllm")
    cache = LineCache()
    _twice(cache, payload, registry[engine].wanted)
    # Histograms, counters, their _created series and the info gauge with many labels.
    _twice(cache, payload, frozenset(parse(payload)))


PAYLOAD = (
    b"first 1\n"
    b"# HELP first help text\n"
    b"# TYPE first gauge\n"
    b'esc{a="q\\"uote",b="back\\\\slash",c="two\\nlines",d="has } and ,"} 2 1700\n'
    b"nan NaN\n"
    b"inf +Inf\n"
    b"inf -Inf\n"
    b"crlf 3\r\n"
    b'h_bucket{le="0.1"} 1\n'
    b'h_bucket{le="+Inf"} 4\n'
    b"h_sum 0.5\n"
    b"h_count 4\n"
    b"firstly 9\n"
    b"bad oops\n"
    b"bad{x=1} 2\n"
    b'bad{x="\\t"} 2\n'
    b"spaced\t5\n"
    b"last 7"
)


@pytest.mark.parametrize(
    "wanted",
    [
        pytest.param(frozenset({"first"}), id="first-line-and-a-longer-name"),
        pytest.param(frozenset({"first", "firstly"}), id="name-prefixing-another"),
        pytest.param(frozenset({"esc"}), id="escapes-and-timestamp"),
        pytest.param(frozenset({"nan", "inf", "crlf"}), id="nan-inf-crlf"),
        pytest.param(frozenset({"h_bucket", "h_sum", "h_count", "h"}), id="histogram"),
        pytest.param(frozenset({"bad"}), id="malformed-counted"),
        pytest.param(frozenset({"spaced", "last"}), id="tab-and-last-line"),
        pytest.param(frozenset({"absent"}), id="absent"),
        pytest.param(frozenset(), id="nothing"),
    ],
)
def test_cache_equals_parse_on_every_edge_of_the_syntax(wanted: frozenset[str]) -> None:
    _twice(LineCache(), PAYLOAD, wanted)


def test_cache_counts_a_cached_malformed_line_at_every_parse() -> None:
    cache = LineCache()
    payload = b"a oops\na 1\n"
    assert [cache.parse(payload, frozenset({"a"})).skipped for _ in range(3)] == [1, 1, 1]


def test_cache_rereads_a_line_when_its_value_changes() -> None:
    cache = LineCache()
    wanted = frozenset({"q"})
    assert cache.parse(b'q{m="x"} 1\n', wanted) == {"q": [Sample("q", {"m": "x"}, 1.0)]}
    assert cache.parse(b'q{m="x"} 2\n', wanted) == {"q": [Sample("q", {"m": "x"}, 2.0)]}


def test_cache_stays_within_its_bounds_when_every_scrape_differs() -> None:
    cache = LineCache(max_lines=8, max_line_bytes=32, max_bytes=40, max_patterns=2)
    for i in range(100):
        payload = b'q %d\nlong{x="%s"} 1\n' % (i, b"y" * 40)
        families = cache.parse(payload, frozenset({"q", "long", f"n{i % 5}"}))
        assert families["q"] == [Sample("q", {}, float(i))]
        assert families["long"] == [Sample("long", {"x": "y" * 40}, 1.0)]
        assert len(cache._series) <= 8  # the long line is never kept
        assert sum(map(len, cache._series)) <= 40
        assert len(cache._patterns) <= 2


def test_cache_holds_one_entry_per_series_however_often_values_change() -> None:
    # Keyed by whole line, every new value was a new entry until the cache was full.
    cache = LineCache()
    wanted = frozenset({"running", "tokens_total", "info"})
    for i in range(1000):
        page = b'running{m="a"} %d\ntokens_total{m="a"} %d 17\ninfo{a="1",b="}"} 1\n' % (i % 7, i)
        families = cache.parse(page, wanted)
        assert families["tokens_total"] == [Sample("tokens_total", {"m": "a"}, float(i), 17)]
    assert len(cache._series) == 3


def test_cache_garbage_page_has_no_samples_and_counts_what_looked_like_one() -> None:
    garbage = b"\x00\xff<html>not metrics</html>\nq{ oops\nq\n" + bytes(range(256))
    _twice(LineCache(), garbage, frozenset({"q"}))
    assert LineCache().parse(garbage, frozenset({"q"})).skipped == 1
