from __future__ import annotations

import dataclasses
import logging
import textwrap

import pytest

from epp.config.loader import load_config
from epp.plugin import Filter, Scorer, ScorerCategory, Stability, TokenizedPrompt
from epp.plugin.params import ParamError, decode
from epp.plugin.registry import PluginRegistry
from epp.plugin.testing import check_filter, check_plugin_class, check_scorer, sample_endpoints
from epp.plugins.scoring.context_length import (
    DEFAULT_LABEL,
    ContextLengthAware,
    parse_range,
    range_score,
)
from tests.builders import handle, make_cycle, make_endpoint, make_request

LABEL = DEFAULT_LABEL


def plugin(**params: object) -> ContextLengthAware:
    return ContextLengthAware(
        name="ctx", params=decode(ContextLengthAware.Params, params), handle=handle()
    )


def request(tokens: int | None):
    req = make_request()
    if tokens is not None:
        req.attributes["TokenizedPrompt/token-producer"] = TokenizedPrompt.from_token_ids(
            [list(range(1, tokens + 1))]
        )
    return req


def labelled(*ranges: str | None):
    return [make_endpoint(i, labels={} if r is None else {LABEL: r}) for i, r in enumerate(ranges)]


def names(endpoints) -> list[str]:
    return [e.name for e in endpoints]


# ---- the formula, as upstream's calculateRangeScore ------------------------------------------


@pytest.mark.parametrize(
    ("n", "low", "high", "expected"),
    [
        pytest.param(0, 0, 20, 0.3 + (0.7 / 1.002 + 0.3) * 0.7, id="tight-full-headroom"),
        pytest.param(10, 0, 20, 0.3 + (0.7 / 1.002 + 0.15) * 0.7, id="tight-half-headroom"),
        pytest.param(0, 0, 10000, 0.3 + (0.35 + 0.3) * 0.7, id="wide"),
        pytest.param(5, 5, 5, 1.0, id="zero-width"),
        pytest.param(9000, 0, 8192, 0.3 / 1.808, id="above"),
        pytest.param(50, 100, 1024, 0.3 / 1.05, id="below"),
    ],
)
def test_range_score_formula(n: int, low: int, high: int, expected: float) -> None:
    assert range_score(n, low, high) == pytest.approx(expected, rel=1e-12)


def test_in_range_is_always_above_every_out_of_range_score() -> None:
    # upstream regression: a wide range at its top end must still score above 0.3
    assert range_score(14999, 0, 15000) > 0.3 > range_score(14999, 15001, 20000) > 0.0
    assert range_score(10**12, 0, 10**12) > 0.3
    assert 0.0 < range_score(10**15, 0, 1) < 0.3


def test_out_of_range_prefers_the_nearest_range() -> None:
    assert range_score(9000, 0, 8192) > range_score(9000, 0, 2048)
    assert range_score(50, 100, 1024) > range_score(50, 500, 2048)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0-100", (0, 100)),
        (" 2048 - 8192 ", (2048, 8192)),
        ("+1-+2", (1, 2)),  # Go's Atoi accepts a sign
        ("7-7", (7, 7)),
        ("", None),
        ("0-100-200", None),
        ("100-50", None),
        ("abc-100", None),
        ("0-", None),
        ("1_000-2000", None),  # Python's int() would accept this, Go's Atoi does not
        ("1.5-2", None),
        ("0-99999999999999999999", None),  # beyond int64
        ("0-" + "9" * 5000, None),  # beyond what int() converts
        ("\u0663-\u0665", None),  # non-ASCII (Arabic-Indic) digits
    ],
)
def test_parse_range(text: str, expected: tuple[int, int] | None) -> None:
    assert parse_range(text) == expected


# ---- scorer ----------------------------------------------------------------------------------


def test_scores_tight_above_wide_above_out_of_range_and_unlabelled_neutral() -> None:
    eps = labelled("0-20", "0-10000", "500-1000", None)
    s = plugin().score(make_cycle(), request(None), eps)  # no tokens: context length 0
    tight, wide, out, unlabelled = (s[e.id] for e in eps)
    assert tight > wide > 0.3 > out > 0.0
    assert unlabelled == 0.5


def test_context_length_is_the_token_count_of_the_token_producer() -> None:
    eps = labelled("0-50", "100-200")
    s = plugin().score(make_cycle(), request(150), eps)
    assert s[eps[0].id] < 0.3 < s[eps[1].id]
    assert s[eps[1].id] == range_score(150, 100, 200)


def test_malformed_label_scores_zero_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    eps = labelled("bogus", "0-100")
    p = plugin()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            s = p.score(make_cycle(), request(10), eps)
            assert s[eps[0].id] == 0.0
            assert s[eps[1].id] > 0.3
    warnings = [r for r in caplog.records if "bogus" in r.getMessage()]
    assert len(warnings) == 1
    assert eps[0].id in warnings[0].getMessage()


def test_other_label_key_is_read_when_configured() -> None:
    ep = make_endpoint(0, labels={"ctx": "0-10", LABEL: "500-600"})
    s = plugin(label="ctx").score(make_cycle(), request(5), [ep])
    assert s[ep.id] > 0.3


def test_many_distinct_label_values_keep_the_cache_bounded() -> None:
    p = plugin()
    eps = [make_endpoint(i, labels={LABEL: f"0-{i + 1}"}) for i in range(3000)]
    p.score(make_cycle(), request(1), eps)
    assert len(p._ranges) <= 1024


# ---- filter ----------------------------------------------------------------------------------


def test_filter_keeps_in_range_and_unlabelled_endpoints() -> None:
    eps = labelled("0-100", "100-500", "0-2000", None, "junk")
    kept = plugin(enableFiltering=True).filter(make_cycle(), request(None), eps)
    assert names(kept) == ["pod-0", "pod-2", "pod-3"]


def test_filter_uses_the_token_count() -> None:
    eps = labelled("0-52", "142-242")
    kept = plugin(enableFiltering=True).filter(make_cycle(), request(42), eps)
    assert names(kept) == ["pod-0"]


def test_filter_returns_nothing_when_no_endpoint_is_in_range_as_upstream() -> None:
    eps = labelled("0-10", "20-30")
    assert plugin(enableFiltering=True).filter(make_cycle(), request(100), eps) == []


def test_filter_passes_everything_through_when_filtering_is_off() -> None:
    eps = labelled("0-10", "junk")
    assert plugin().filter(make_cycle(), request(100), eps) is eps


# ---- configuration and contract --------------------------------------------------------------


def test_params_default_and_reject_an_empty_label() -> None:
    p = decode(ContextLengthAware.Params, None)
    assert (p.label, p.enable_filtering) == (LABEL, False)
    with pytest.raises(ParamError, match="'label' must be specified"):
        decode(ContextLengthAware.Params, {"label": ""})
    with pytest.raises(ParamError, match="extra: unknown field"):
        decode(ContextLengthAware.Params, {"label": "x", "extra": 1})


def test_is_a_beta_affinity_scorer_and_filter_that_consumes_the_tokenized_prompt() -> None:
    p = plugin()
    assert isinstance(p, Scorer) and isinstance(p, Filter)
    assert p.category is ScorerCategory.AFFINITY
    assert ContextLengthAware.STABILITY is Stability.BETA
    assert p.consumes() == {"TokenizedPrompt/token-producer"}


def test_loader_adds_the_token_producer() -> None:
    text = textwrap.dedent("""\
        apiVersion: llm-d.ai/v1alpha1
        kind: EndpointPickerConfig
        plugins:
        - type: context-length-aware
          parameters: {enableFiltering: true}
        """)
    pipeline = load_config(text, registry=PluginRegistry.from_entry_points(), handle_for=handle)
    assert [p.typed_name.type for p in pipeline.producers] == ["token-producer"]
    profile = pipeline.profiles["default"]
    assert [f.typed_name.type for f in profile.filters] == ["context-length-aware"]
    assert [s.typed_name.type for s, _ in profile.scorers] == ["context-length-aware"]


@pytest.mark.parametrize("filtering", [False, True])
def test_contract(filtering: bool) -> None:
    check_plugin_class(ContextLengthAware, "context-length-aware")
    p = plugin(enableFiltering=filtering)
    ranges = ["0-10", "0-100", "50-60", None, "bad", "100-50", "0-100000"]
    for n in (0, 1, 7, 50):
        eps = [
            dataclasses.replace(
                ep, labels={**ep.labels, **({LABEL: ranges[i % 7]} if ranges[i % 7] else {})}
            )
            for i, ep in enumerate(sample_endpoints(n, seed=n))
        ]
        for req in (request(None), request(55)):
            check_scorer(p, eps, req)
            check_filter(p, eps, req)
