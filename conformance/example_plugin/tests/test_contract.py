from epp_example_plugin.filter import MaxQueueFilter
from epp_example_plugin.scorer import LabelScorer

from epp.plugin.testing import (
    check_filter,
    check_plugin_class,
    check_scorer,
    sample_endpoints,
)


def test_label_scorer_honours_the_contract():
    check_plugin_class(LabelScorer, "example-label-scorer")
    scorer = LabelScorer(name="s", params=LabelScorer.Params(label="zone", value="z1"), handle=None)
    for n in (0, 1, 7):
        check_scorer(scorer, sample_endpoints(n))
    scores = scorer.score(None, None, sample_endpoints(3))
    assert sorted(scores.values()) == [0.0, 0.0, 1.0]


def test_max_queue_filter_honours_the_contract():
    check_plugin_class(MaxQueueFilter, "example-max-queue-filter")
    flt = MaxQueueFilter(name="f", params=MaxQueueFilter.Params(max_waiting=5), handle=None)
    for n in (0, 1, 7):
        check_filter(flt, sample_endpoints(n))
    kept = flt.filter(None, None, sample_endpoints(20))
    assert kept and all(e.metrics.waiting_queue_size <= 5 for e in kept)
