"""The replica benchmark's pieces: target keys, the windows and recovery over outcomes, the
report's tables."""

from __future__ import annotations

import math

import pytest

from epp_tools.bench.replicas.report import render
from epp_tools.bench.runner import targets
from epp_tools.bench.runner.agentload import failure_kinds, hit_ratio, recovery_seconds, windows
from epp_tools.bench.runner.driver import Outcome
from epp_tools.stack.eppconfig import with_syncer


def out(sent: float, prompt: int = 100, cached: int = 0, status: int = 200) -> Outcome:
    o = Outcome(0, "s", "", status, sent=sent, prompt_tokens=prompt, cached_tokens=cached)
    o.tokens = 1 if status == 200 else 0
    return o


@pytest.mark.parametrize(
    ("key", "shape", "label"),
    [
        ("epp", targets.ReplicaShape(), "EPP (default config) via Envoy"),
        ("epp-r2", targets.ReplicaShape(replicas=2), "EPP x2 replicas learning alone"),
        ("epp-r3-redis", targets.ReplicaShape(3, True), "EPP x3 replicas sharing via Redis"),
        ("epp-w2", targets.ReplicaShape(workers=2, shared=True), "EPP --workers 2 via Envoy"),
    ],
)
def test_replica_target_keys(key: str, shape: targets.ReplicaShape, label: str) -> None:
    assert targets.is_known(key)
    assert targets.replica_shape(key) == shape
    assert targets.label(key) == label


@pytest.mark.parametrize("key", ["epp-r1", "epp-r9", "epp-r2-memcached", "epp-w1", "epp-x2"])
def test_unknown_replica_keys_are_refused(key: str) -> None:
    assert not targets.is_known(key)


def test_windows_and_hit_ratio_count_only_answered_requests() -> None:
    outcomes = [out(0.1, cached=50), out(0.5, cached=100), out(1.2, status=503), out(1.5, 100, 0)]
    assert hit_ratio(outcomes) == pytest.approx(150 / 300)
    w = windows(outcomes, 1.0, 2.0)
    assert [(x["requests"], x["failed"]) for x in w] == [(2, 0), (2, 1)]
    assert w[0]["hit"] == pytest.approx(0.75) and w[1]["hit"] == 0.0
    assert failure_kinds(outcomes) == {"503": 1}


def test_recovery_is_the_first_window_back_at_the_level() -> None:
    # hit ratio 0 until 3 s after the return at t=10, then 90%
    outcomes = [out(10 + k / 10, cached=90 if k >= 30 else 0) for k in range(80)]
    assert recovery_seconds(outcomes, 10.0, 0.85, width=1.0, limit=6.0) == 3.0
    assert recovery_seconds(outcomes, 10.0, 0.95, width=1.0, limit=6.0) == math.inf


def test_with_syncer_names_redis_as_the_cross_replica_syncer() -> None:
    text = with_syncer("plugins:\n- type: queue-scorer\n", "redis://127.0.0.1:1/0")
    assert "type: redis-syncer" in text and "crossReplicaSyncerPluginRef: redis-syncer" in text
    assert "url: redis://127.0.0.1:1/0" in text and "crossReplicaSyncInterval: 200ms" in text


def test_report_shows_each_scenario() -> None:
    report = {
        "started": "t",
        "cpus": 2,
        "outage": {
            "requests": 10, "failed": 0, "killed_at": 5.0, "back_at": 10.0, "hit_before": 0.9,
            "hit_during": 0.8, "hit_after": 0.9, "recovery_s": 0.5, "sync_errors": [3.0, 4.0],
            "windows": [{"t": 0.0, "requests": 10, "failed": 0, "hit": 0.9}],
        },
        "restart": {"runs": [{"shared": True, "requests": 5, "failed": 0, "back_after_s": 1.0,
                              "restarted_hit": 0.8, "others_hit": 0.82, "ratio": 0.8 / 0.82}]},
        "workers": {"cpus": 2, "runs": [
            {"workers": 1, "requests": 9, "failed": 0, "req_per_s": 100.0, "cpu_cores": {},
             "epp_cpu_ms_per_req": 1.0},
            {"workers": 2, "requests": 9, "failed": 0, "req_per_s": 150.0, "cpu_cores": {},
             "epp_cpu_ms_per_req": 1.0},
        ]},
    }  # fmt: skip
    text = render(report)
    assert "| 10 | 0 | 90.0% | 80.0% | 90.0% | 0.5 s |" in text
    assert "| shared via Redis | 5 | 0 | 1.0 s | 80.0% | 82.0% | 97.6% |" in text
    assert "Throughput ratio (--workers 2 / one process): 1.50." in text
