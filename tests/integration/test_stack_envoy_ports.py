"""The stack's Envoy picks its own ports free, and one may be taken before Envoy binds it (another
test's process, in a parallel or busy run): it then starts again on new ports instead of failing
the test that needed it."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from epp_tools.stack import envoy as envoy_mod
from epp_tools.stack.envoy import Envoy

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(120)]


def test_a_port_taken_between_picking_and_binding_is_picked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        real = envoy_mod.free_port
        picks = iter([busy])  # the first pick is a port something already listens on
        monkeypatch.setattr(envoy_mod, "free_port", lambda: next(picks, None) or real())
        proxy = Envoy(config_name="full-duplex", epp_port=real()).start()
        try:
            assert proxy.listen_port != busy
            with urllib.request.urlopen(f"http://127.0.0.1:{proxy.admin_port}/ready") as r:
                assert r.status == 200
        finally:
            proxy.stop()


def test_ports_given_by_the_caller_are_not_changed_when_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match="Address already in use"):
            Envoy(config_name="full-duplex", epp_port=1, listen_port=busy,
                  admin_port=envoy_mod.free_port()).start()  # fmt: skip


def test_ports_picked_together_are_distinct_even_when_a_pick_repeats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    picks = iter([20001, 20002, 20001, 20002, 20003, 20001, 20004])
    monkeypatch.setattr(envoy_mod, "free_port", lambda: next(picks))
    assert envoy_mod.free_ports(4) == [20001, 20002, 20003, 20004]


def test_an_epp_set_never_gives_two_processes_one_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from epp_tools.stack.replicas import EppSet

    picks = iter([21001, 21002, 21001, 21003, 21004, 21002, 21005, 21006])
    monkeypatch.setattr(envoy_mod, "free_port", lambda: next(picks))
    group = EppSet(tmp_path, "apiVersion: v1\n", replicas=2).prepare()
    ports = [p for ports in group.ports for p in (ports.grpc, ports.health, ports.metrics)]
    assert sorted(ports) == [21001, 21002, 21003, 21004, 21005, 21006]
