"""``PodRuntime.metrics_page``: the rendered ``/metrics`` page is kept while nothing it shows
changes, and rendered again as soon as something does."""

from __future__ import annotations

import pytest

from epp_tools.sim import runtime as sim_runtime
from epp_tools.sim.config import PodConfig
from epp_tools.sim.control import Overrides
from epp_tools.sim.metrics import parse_text
from epp_tools.sim.runtime import PodRuntime


def _value(page: bytes, name: str) -> float:
    return next(v for n, _, v in parse_text(page.decode()) if n == name)


def _fresh(runtime: PodRuntime) -> bytes:
    return runtime.metrics.render(runtime.engine, runtime.overrides, 0.0).encode()


async def test_an_idle_pod_serves_the_same_page_without_rendering_it_again() -> None:
    runtime = PodRuntime(PodConfig())
    first = runtime.metrics_page()
    assert runtime.metrics_page() is first
    assert first == _fresh(runtime)
    runtime.close()


async def test_a_request_renders_the_page_again_while_it_runs_and_when_it_ends() -> None:
    runtime = PodRuntime(PodConfig(time_scale=1000.0))
    idle = runtime.metrics_page()
    channel = runtime.submit("r1", list(range(1, 64)), 3, None)
    running = runtime.metrics_page()
    assert running != idle
    assert running == _fresh(runtime)
    while not (await channel.get()).finished:
        pass
    done = runtime.metrics_page()
    assert done not in (idle, running)
    assert done == _fresh(runtime)
    assert _value(done, "vllm:generation_tokens_total") == 3.0
    assert _value(done, "vllm:num_requests_running") == 0.0
    runtime.close()


async def test_an_aborted_request_renders_the_page_again() -> None:
    runtime = PodRuntime(PodConfig())
    runtime.metrics_page()
    runtime.submit("r1", list(range(1, 64)), 100, None)
    runtime.abort("r1")
    page = runtime.metrics_page()
    assert page == _fresh(runtime)
    assert _value(page, "vllm:num_requests_running") == 0.0
    runtime.close()


async def test_new_overrides_render_the_page_again() -> None:
    runtime = PodRuntime(PodConfig())
    before = runtime.metrics_page()
    runtime.overrides = Overrides(num_requests_waiting=7)
    after = runtime.metrics_page()
    assert _value(before, "vllm:num_requests_waiting") == 0.0
    assert _value(after, "vllm:num_requests_waiting") == 7.0
    runtime.overrides = Overrides()
    assert _value(runtime.metrics_page(), "vllm:num_requests_waiting") == 0.0
    runtime.close()


async def test_with_lora_adapters_every_page_is_rendered_with_the_current_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = PodRuntime(PodConfig(lora_adapters=("a",)))
    clock = iter((1000.0, 1001.0))
    monkeypatch.setattr(sim_runtime.time, "time", lambda: next(clock))
    first = runtime.metrics_page()
    second = runtime.metrics_page()
    assert _value(first, "vllm:lora_requests_info") == 1000.0
    assert _value(second, "vllm:lora_requests_info") == 1001.0
    runtime.close()
