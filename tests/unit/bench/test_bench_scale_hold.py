"""The scale bench's hold: the EPP's bounded state read beside its RSS."""

from __future__ import annotations

from aiohttp import web

from epp_tools.bench.scale import probe, report

METRICS = """# HELP llm_d_epp_prefix_indexer_size Size of the prefix indexer.
# TYPE llm_d_epp_prefix_indexer_size gauge
llm_d_epp_prefix_indexer_size{plugin_name="a",plugin_type="approx-prefix-cache-producer"} 1200.0
llm_d_epp_prefix_indexer_size{plugin_name="b",plugin_type="approx-prefix-cache-producer"} 34.0
llm_d_epp_prefix_indexer_size_total 9.0
# TYPE llm_d_epp_response_affinity_bindings gauge
llm_d_epp_response_affinity_bindings{plugin_name="response-affinity-filter"} 77.0
"""


async def test_state_gauges_sum_each_family_over_its_label_sets() -> None:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=METRICS)

    async def runtime(request: web.Request) -> web.Response:
        if "tracemalloc" in request.query:
            action, top = request.query["tracemalloc"], request.query["top"]
            return web.json_response({"tracemalloc": {"action": action, "top": top}})
        assert request.query["heap"] == "1" and request.query["pymalloc"] == "1"
        heap = {"inUseBytes": 5 * 2**20, "freeBytes": 2**20, "arenaBytes": 6 * 2**20}
        return web.json_response({"rssBytes": 1, "heap": heap, "pymalloc": {"allocatedBytes": 7}})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/debug/runtime", runtime)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        url = f"http://127.0.0.1:{port}/metrics"
        state = await probe.state_gauges(url)
        diff = await probe.tracemalloc_command(url, "diff", top=7)
    finally:
        await runner.cleanup()
    assert state == {
        "prefix_entries": 1234.0,
        "response_bindings": 77.0,
        "pymalloc_bytes": 7.0,
        "heap_in_use_bytes": 5 * 2**20,
        "heap_free_bytes": 2**20,
    }
    assert await probe.state_gauges("") == {}
    assert diff == {"action": "diff", "top": "7"}
    assert await probe.tracemalloc_command("", "baseline") == {}


def test_hold_line_says_what_the_bounded_state_did() -> None:
    hold = {
        "minutes": 30,
        "errors": 0,
        "rss_samples": [[0.0, {"epp": 300 * 2**20}], [1800.0, {"epp": 350 * 2**20}]],
        "state_samples": [
            [0.0, {"prefix_entries": 1000.0, "response_bindings": 10.0, "heap_free_bytes": 2**21}],
            [1800.0, {"prefix_entries": 5000.0, "response_bindings": 90.0, "heap_free_bytes": 0}],
        ],
    }
    line = report._hold_line(hold)
    assert "RSS epp 300 -> 350 MB; 0 errors." in line
    assert "prefix index entries 1,000 -> 5,000, Responses bindings 10 -> 90, " in line
    assert "C heap free but held 2 -> 0 MB." in line
    assert "Over the same time" not in report._hold_line({**hold, "state_samples": []})


def test_hold_lists_the_traced_sites_that_grew() -> None:
    top = [{"site": "epp/x.py:12", "bytes": 3 * 2**20, "bytesDiff": 2**20, "blocks": 9,
            "blocksDiff": 1200}]  # fmt: skip
    hold = {
        "minutes": 1,
        "errors": 0,
        "rss_samples": [[0.0, {"epp": 2**20}]],
        "tracemalloc": {"sizeDiffBytes": 2**21, "top": top},
    }
    text = report._hold_line(hold)
    assert "Traced Python allocations over the hold: +2.0 MB in all" in text
    assert "| `epp/x.py:12` | 3.0 | +1.0 | +1,200 |" in text


def test_a_hold_longer_than_the_window_reports_its_last_minutes_apart() -> None:
    mb = 2**20
    rss = [[float(t), {"epp": (300 + min(t, 3600) // 60) * mb}] for t in range(0, 5401, 600)]
    state = [[float(t), {"prefix_entries": float(min(t, 3600))}] for t in range(0, 5401, 600)]
    hold = {"minutes": 90, "errors": 0, "rss_samples": rss, "state_samples": state}
    line = report._hold_line(hold)
    assert "RSS epp 300 -> 360 MB; 0 errors." in line
    assert "Its last 30 minutes: RSS epp 360 -> 360 MB (range 360-360 MB)." in line
    assert "Over those minutes: prefix index entries 3,600 -> 3,600." in line
    short = {**hold, "rss_samples": rss[:4], "state_samples": state[:4]}
    assert "Its last" not in report._hold_line(short)
