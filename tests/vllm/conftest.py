"""Marker of the real-vLLM tests (``-m vllm`` selects them, ``-m "not vllm"`` leaves them out)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "vllm: starts real vLLM servers (needs bash tests/vllm/setup_vllm.sh)"
    )
