"""Every shell block of the README (and of each page under ``docs/``) runs, in order, with the
outcome its ``<!-- doc-test: ... -->`` comment states: a wrong example fails here. The
convention (background servers, readiness, expected output, skips with their reason) is
``tests/docshell.py``'s docstring. One test per block; each document runs once, on first use."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.docshell import REPO, Outcome, blocks, documents, run_document

# A document's servers (simulated pods, the EPP, Envoy) start in turn: minutes on a busy
# machine. The bound stops a hang; it is not a speed check.
pytestmark = [pytest.mark.envoy, pytest.mark.timeout(900)]

BLOCKS = [
    pytest.param(path, block.id, id=block.id)
    for path in documents()
    for block in blocks(path.read_text(), str(path.relative_to(REPO)))
]


@pytest.fixture(scope="module")
def outcome() -> Callable[..., Outcome]:
    runs: dict[str, dict[str, Outcome]] = {}

    def of(path, block_id: str) -> Outcome:  # type: ignore[no-untyped-def]
        if str(path) not in runs:
            runs[str(path)] = run_document(path)
        return runs[str(path)][block_id]

    return of


@pytest.mark.parametrize(("path", "block_id"), BLOCKS)
def test_shell_block_runs_as_written(outcome: Callable[..., Outcome], path, block_id: str) -> None:  # type: ignore[no-untyped-def]
    result = outcome(path, block_id)
    if result.skipped:
        pytest.skip(f"{block_id}: {result.detail}")
    assert result.passed, f"{block_id}:\n{result.block.text}\n{result.detail}"
