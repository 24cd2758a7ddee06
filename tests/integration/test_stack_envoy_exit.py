"""The stack's Envoy, when it had exited on its own (killed, crashed) before it is stopped, says so
with its exit code and the end of its log before its directory, and the log in it, is removed."""

from __future__ import annotations

import pytest

from epp_tools.stack import envoy as envoy_mod
from epp_tools.stack.envoy import Envoy

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(120)]


def test_an_envoy_that_exited_on_its_own_says_so_before_its_log_goes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    proxy = Envoy(config_name="full-duplex", epp_port=envoy_mod.free_port()).start()
    assert proxy.proc is not None
    proxy.proc.kill()
    proxy.proc.wait(timeout=10)
    proxy.stop()
    err = capsys.readouterr().err
    assert f"envoy (pid {proxy.proc.pid}) had exited on its own with -9" in err
    proxy = Envoy(config_name="full-duplex", epp_port=envoy_mod.free_port()).start()
    proxy.stop()  # stopped by us: nothing to say
    assert "exited on its own" not in capsys.readouterr().err
