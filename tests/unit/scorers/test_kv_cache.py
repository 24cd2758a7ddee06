from __future__ import annotations

import dataclasses

import pytest

from epp.plugin import (
    TOKENIZED_PROMPT,
    Endpoint,
    InferenceRequest,
    NoParams,
    ProfileResult,
    ResponseInfo,
    SchedulingResult,
    Scorer,
    ScorerCategory,
    TokenizedPrompt,
    Usage,
)
from epp.plugin.kvusage import MAX_DONE, MAX_OPEN, KVTracker
from epp.plugin.prefix import TOKEN_BYTES
from scorers.kv_cache import KVCacheUtilizationScorer
from tests.builders import FakeHandle, handle, make_cycle, make_endpoint, make_request


def _scorer() -> KVCacheUtilizationScorer:
    return KVCacheUtilizationScorer(name="", params=NoParams(), handle=handle())


@pytest.mark.parametrize(
    ("kv", "expected"),
    [
        pytest.param(0.0, 1.0, id="empty-cache"),
        pytest.param(0.25, 0.75, id="quarter"),
        pytest.param(0.9, 0.1, id="nearly-full"),
        pytest.param(1.0, 0.0, id="full"),
        pytest.param(1.2, 0.0, id="over-full-clamped"),
        pytest.param(-0.5, 1.0, id="negative-clamped"),
    ],
)
def test_score_is_free_fraction_when_metrics_present(kv: float, expected: float) -> None:
    endpoint = make_endpoint(0, kv=kv)
    scores = _scorer().score(make_cycle(), make_request(), [endpoint])
    assert scores == {endpoint.id: pytest.approx(expected)}


def test_score_is_zero_when_metrics_missing() -> None:
    endpoints = [dataclasses.replace(make_endpoint(0), metrics=None), make_endpoint(1, kv=0.5)]
    scores = _scorer().score(make_cycle(), make_request(), endpoints)
    assert scores == {endpoints[0].id: 0.0, endpoints[1].id: 0.5}


def test_plugin_is_distribution_scorer_when_constructed() -> None:
    plugin = _scorer()
    assert isinstance(plugin, Scorer)
    assert plugin.category is ScorerCategory.DISTRIBUTION
    assert plugin.typed_name.type == "kv-cache-utilization-scorer"


# ---- usage as of now: the scrape corrected by this EPP's dispatches and completions ----------

BLOCKS, BLOCK = 1000, 16  # 16,000 tokens of KV


def _ep(kv: float, scraped_at: float, blocks: int = BLOCKS, block: int = BLOCK) -> Endpoint:
    ep = make_endpoint(0, kv=kv, update_time=scraped_at)
    assert ep.metrics is not None
    metrics = dataclasses.replace(ep.metrics, cache_num_blocks=blocks, cache_block_size=block)
    return dataclasses.replace(ep, metrics=metrics)


def _tracked() -> tuple[KVCacheUtilizationScorer, FakeHandle]:
    h = FakeHandle(now=100.0)
    return KVCacheUtilizationScorer(name="kv", params=NoParams(), handle=h), h


def _dispatch(scorer: KVCacheUtilizationScorer, rid: str, tokens: int) -> InferenceRequest:
    prompt = TokenizedPrompt((b"\0" * TOKEN_BYTES * tokens,))
    request = make_request(
        request_id=rid, attributes={TOKENIZED_PROMPT.key("token-producer"): prompt}
    )
    target = make_endpoint(0)
    scorer.pre_request(request, SchedulingResult({"default": ProfileResult((target,))}, "default"))
    return request


def _complete(scorer: KVCacheUtilizationScorer, request: InferenceRequest, **usage: int) -> None:
    scorer.response_complete(request, ResponseInfo(request.request_id, {}, usage=Usage(**usage)))


def _score(scorer: KVCacheUtilizationScorer, ep: Endpoint) -> float:
    return scorer.score(make_cycle(), make_request(), [ep])[ep.id]


def test_a_completion_after_the_scrape_frees_what_the_request_held() -> None:
    scorer, h = _tracked()
    request = _dispatch(scorer, "r1", 4000)
    h.now = 100.05  # scraped while r1 ran: 50% used
    ep = _ep(0.5, scraped_at=h.now)
    assert _score(scorer, ep) == pytest.approx(0.5)
    h.now = 100.06
    _complete(scorer, request, prompt_tokens=3900, completion_tokens=100)
    assert _score(scorer, ep) == pytest.approx(0.75)  # 4000 of 16000 tokens released
    h.now = 100.1  # the next scrape saw the completion: no correction left
    assert _score(scorer, _ep(0.25, scraped_at=h.now)) == pytest.approx(0.75)


def test_a_dispatch_after_the_scrape_takes_its_prompt() -> None:
    scorer, h = _tracked()
    ep = _ep(0.1, scraped_at=h.now)
    h.now += 0.01
    request = _dispatch(scorer, "r1", 1600)
    assert _score(scorer, ep) == pytest.approx(0.8)
    h.now += 0.01
    _complete(scorer, request)  # came and went after the scrape: nothing left to correct
    assert _score(scorer, ep) == pytest.approx(0.9)


def test_released_tokens_are_the_prompt_when_the_server_reports_no_usage() -> None:
    scorer, h = _tracked()
    request = _dispatch(scorer, "r1", 1600)
    h.now += 0.01
    ep = _ep(0.3, scraped_at=h.now)
    h.now += 0.01
    _complete(scorer, request)
    assert _score(scorer, ep) == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("blocks", "block", "age"),
    [
        pytest.param(0, BLOCK, 0.0, id="no-num-blocks"),
        pytest.param(BLOCKS, 0, 0.0, id="no-block-size"),
        pytest.param(BLOCKS, BLOCK, 2.5, id="stale-metrics"),
    ],
)
def test_upstream_formula_exactly_without_kv_size_or_with_stale_metrics(
    blocks: int, block: int, age: float
) -> None:
    scorer, h = _tracked()
    request = _dispatch(scorer, "r1", 4000)
    ep = _ep(0.5, scraped_at=h.now, blocks=blocks, block=block)
    h.now += 0.01
    _complete(scorer, request)
    h.now += age
    assert _score(scorer, ep) == pytest.approx(0.5)


def test_estimate_is_clamped_and_never_scraped_endpoints_are_not_corrected() -> None:
    scorer, h = _tracked()
    request = _dispatch(scorer, "r1", 16000)
    ep = _ep(0.2, scraped_at=h.now)
    h.now += 0.01
    _complete(scorer, request)
    assert _score(scorer, ep) == 1.0  # 0.2 - 1.0 clamped to 0 used
    assert _score(scorer, _ep(0.2, scraped_at=0.0)) == pytest.approx(0.8)
    assert scorer.consumes() == frozenset({TOKENIZED_PROMPT.key("token-producer")})


def test_memory_is_bounded() -> None:
    tracker = KVTracker(horizon=2.0)
    for i in range(MAX_OPEN + 10):
        tracker.dispatch(f"r{i}", "ep", float(i) * 1e-6, 1)
    assert len(tracker) == MAX_OPEN  # the oldest forgotten
    tracker.complete("r0", 1.0, 0)  # forgotten: nothing recorded
    assert tracker.change("ep", 0.0) == MAX_OPEN
    for i in range(MAX_DONE + 10):
        tracker.complete(f"r{i + 10}", 1.0, 1)
    assert tracker.change("ep", 0.0) == MAX_OPEN - MAX_DONE - 10  # all sent after 0.0
    assert tracker.change("ep", 0.5) == -MAX_DONE  # sent before 0.5: only the newest are kept
    tracker.complete(f"r{MAX_DONE + 20}", 10.0, 1)  # 9 s later: older records are dropped
    assert tracker.change("ep", 9.5) == -1  # only the completion after 9.5 is left


def test_it_reads_no_response_body_and_releases_the_prompt_without_usage() -> None:
    # a skipped body leaves usage unknown: the completion releases the prompt's tokens, as in
    # test_released_tokens_are_the_prompt_when_the_server_reports_no_usage
    scorer, _ = _tracked()
    assert (
        scorer.needs_response_body(make_request(), ResponseInfo(request_id="r", headers={}))
        is False
    )
