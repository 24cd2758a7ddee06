"""Envoy's health checks of EPP replicas (the cluster ``epp envoy-config`` builds): a replica that
answers NOT_SERVING leaves rotation at the first check, and one that is merely slow to answer
(its process stopped for longer than one health-check timeout: a starved CPU, a long pause)
stays in rotation. The replicas here are bare ``grpc.health.v1`` servers in their own processes,
so that one can be stopped (SIGSTOP) without stopping the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from epp.envoyconfig.bootstrap import bootstrap
from epp.envoyconfig.clusters import UNHEALTHY_THRESHOLD
from epp.envoyconfig.options import EnvoyOptions
from epp.envoyconfig.render import as_dict, dump
from epp_tools.stack.envoy import Envoy, free_port

# Two Python processes and Envoy start per test: on a busy machine that alone takes a minute.
pytestmark = [pytest.mark.envoy, pytest.mark.timeout(300)]

SERVER = """
import signal, sys, threading
from concurrent import futures
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
servicer = health.HealthServicer()
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
server.add_insecure_port("127.0.0.1:" + sys.argv[1])
servicer.set("", health_pb2.HealthCheckResponse.SERVING)
stop = threading.Event()
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
signal.signal(signal.SIGUSR1, lambda *_: servicer.set("", NOT_SERVING))
signal.signal(signal.SIGTERM, lambda *_: stop.set())
server.start()
print("serving", flush=True)
stop.wait()
server.stop(0)
"""

# Waits bound a failure only: a busy machine may take many seconds to start a process or run a
# health check round.
HANG = 60.0
INTERVAL = 2.0
"""Seconds between health checks: long beside the test's 20 ms polls of Envoy's stats, so the
snapshot that first shows a change counts the check that made it, even on a busy machine."""


@pytest.fixture
def replicas() -> Iterator[list[tuple[subprocess.Popen[str], int]]]:
    procs: list[tuple[subprocess.Popen[str], int]] = []
    try:
        for _ in range(2):
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True
            )
            procs.append((proc, port))
        for proc, _ in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "serving"
        yield procs
    finally:
        for proc, _ in procs:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            proc.wait(timeout=HANG)


@pytest.fixture
def proxy(replicas: list[tuple[subprocess.Popen[str], int]]) -> Iterator[Envoy]:
    listen, admin = free_port(), free_port()
    opts = EnvoyOptions(
        epp=[("127.0.0.1", port) for _, port in replicas], tls="plaintext",
        listen=("127.0.0.1", listen), admin=("127.0.0.1", admin), health_interval=INTERVAL,
    )  # fmt: skip
    text = dump(as_dict(bootstrap(opts)))
    envoy = Envoy("full-duplex", config_text=text, listen_port=listen, admin_port=admin).start()
    try:
        until(envoy, lambda s: s.get("cluster.epp.membership_healthy", 0) == 2)
        yield envoy
    finally:
        envoy.stop()


Stats = dict[str, int]


def until(envoy: Envoy, predicate: Callable[[Stats], bool]) -> Stats:
    """Envoy's stats once ``predicate`` holds for them (polled; the bound only a hang reaches)."""
    deadline = time.monotonic() + HANG
    while not predicate(stats := envoy.stats()):
        assert time.monotonic() < deadline, stats
        time.sleep(0.02)
    return stats


HC = "cluster.epp.health_check."


def test_replica_slow_to_answer_its_health_check_stays_in_rotation(replicas, proxy) -> None:
    before = proxy.stats()
    failures = before[HC + "network_failure"]
    os.kill(replicas[1][0].pid, signal.SIGSTOP)
    try:  # one health check times out on the stopped replica
        timed_out = until(proxy, lambda s: s[HC + "network_failure"] > failures)
    finally:
        os.kill(replicas[1][0].pid, signal.SIGCONT)
    # it answers again: a check succeeds after the failure, and it never left rotation
    after = until(proxy, lambda s: s[HC + "success"] > timed_out[HC + "success"])
    assert timed_out["cluster.epp.membership_healthy"] == 2
    assert after["cluster.epp.membership_healthy"] == 2
    assert after["cluster.epp.membership_change"] == before["cluster.epp.membership_change"]


def test_replica_answering_not_serving_leaves_rotation_at_the_first_check(replicas, proxy) -> None:
    before = proxy.stats()
    os.kill(replicas[1][0].pid, signal.SIGUSR1)
    out = until(proxy, lambda s: s["cluster.epp.membership_healthy"] == 1)
    failed = out[HC + "failure"] - before[HC + "failure"]
    # polled every 20 ms while Envoy checks every 2 s: the snapshot that first shows the replica
    # out counts the one failed check (or, polled late, the next); never the threshold
    assert 1 <= failed < UNHEALTHY_THRESHOLD, failed
    assert out[HC + "network_failure"] == before[HC + "network_failure"]
