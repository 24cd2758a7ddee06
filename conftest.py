"""Suite-wide hooks. The suite runs in random order (pytest-randomly); the seed is printed at the
start and in the summary, also under ``-q``, so a failing order can be repeated with
``--randomly-seed=N``."""

from __future__ import annotations

import pytest


def _seed_line(config: pytest.Config) -> str | None:
    if not config.pluginmanager.hasplugin("randomly"):
        return None
    return f"random order: repeat with --randomly-seed={config.getoption('randomly_seed')}"


def pytest_sessionstart(session: pytest.Session) -> None:
    line = _seed_line(session.config)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if line and reporter is not None:
        reporter.write_line(line)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    line = _seed_line(config)
    if line:
        terminalreporter.write_line(line)
