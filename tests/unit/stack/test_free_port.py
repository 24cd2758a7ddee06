"""``free_port`` hands out ports an outgoing connection cannot take meanwhile."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from epp_tools.stack.envoy import free_port

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not RANGE.exists(), reason="no /proc/sys/net/ipv4/ip_local_port_range here")
def test_port_is_bindable_and_below_the_ephemeral_range() -> None:
    low = int(RANGE.read_text().split()[0])
    if low < 11000:
        pytest.skip(f"ephemeral range starts at {low}: no room below it")
    ports = {free_port() for _ in range(20)}
    assert all(10000 <= p < low for p in ports), ports
    assert len(ports) > 1, "ports are spread, not one fixed port"
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
