"""``epp bench micro`` rows for the CPU of one scrape's parsing, old and new side by side.

A simulated vLLM pod's ``/metrics`` page (``epp sim``'s renderer, about 13 KB: histograms,
counters, and the ``cache_config_info`` gauge with some forty labels) is read by:

* ``promtext.parse`` with the wanted series of the ``vllm`` engine: how every scrape was parsed
  before (each wanted name found with ``bytes.find``, each of its lines parsed);
* ``promtext.LineCache.parse``: what ``core-metrics-extractor`` runs now (one pass of a compiled
  pattern, and a line already seen is not parsed again; the page repeats, as at idle);
* ``core-metrics-extractor`` ``extract`` with each of them: the parse plus the series selection
  and the new ``Metrics``.

The CPU of a whole scrape in the EPP process (timer, HTTP exchange and all) is what the idle
rows measure (``epp_tools.bench.micro.idle``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from epp.plugin import Endpoint, Handle, Metrics
from epp.plugin.params import decode
from epp.plugins.sources import promtext
from epp.plugins.sources.core_extractor import CoreMetricsExtractor
from epp.plugins.sources.engines import build_registry

_STEP = "scrape"


class _PlainParse(promtext.LineCache):
    """The parse every scrape made before the cache: ``promtext.parse``, nothing remembered."""

    def parse(self, text: bytes, wanted: frozenset[str]) -> promtext.Families:
        return promtext.parse(text, wanted)


def sim_page() -> bytes:
    from epp_tools.sim.config import PodConfig
    from epp_tools.sim.control import Overrides
    from epp_tools.sim.engine import Engine
    from epp_tools.sim.metrics import MetricsRenderer

    config = PodConfig()
    engine = Engine(config)
    return MetricsRenderer(config).render(engine, Overrides(), 0.0).encode()


def _extractor(handle: Handle, plain: bool) -> CoreMetricsExtractor:
    params = decode(CoreMetricsExtractor.Params, {})
    extractor = CoreMetricsExtractor(name="core", params=params, handle=handle)
    if plain:
        extractor._lines = _PlainParse()  # the previous path, for the side-by-side row
    return extractor


def cases(handle: Handle) -> list[tuple[str, Callable[[], object]]]:
    """(label, one scrape's work) for the old and the new path, interleaved."""
    page = sim_page()
    wanted = build_registry((), "vllm")[1].wanted
    cache = promtext.LineCache()
    endpoint = Endpoint(
        id="default/pod-0-rank-0", name="pod-0", namespace="default", address="127.0.0.1", port=8000
    )
    empty = Metrics()
    old, new = _extractor(handle, plain=True), _extractor(handle, plain=False)
    return [
        ("parse (before: promtext.parse)", partial(promtext.parse, page, wanted)),
        ("parse (now: LineCache)", partial(cache.parse, page, wanted)),
        ("core-metrics-extractor (before)", partial(old.extract, page, endpoint, empty, now=1.0)),
        ("core-metrics-extractor (now)", partial(new.extract, page, endpoint, empty, now=1.0)),
    ]


def step(label: str) -> str:
    return f"{_STEP}: {label}"


def size() -> str:
    return f"vLLM sim, {len(sim_page()) // 1000} KB"
