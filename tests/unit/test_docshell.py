"""The docs' shell-block runner (``tests/docshell.py``): what a marker means, and that a wrong
example fails (wrong exit status, missing output, a server that never comes up, a command that
does not end) while leaving no process behind."""

from __future__ import annotations

import os
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from epp_tools.stack.envoy import free_port
from tests.docshell import Block, MarkerError, blocks, documents, run_document


def _doc(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "README.md"
    path.write_text(textwrap.dedent(text))
    return path


def test_markers_set_the_expectations_of_the_block_after_them() -> None:
    text = textwrap.dedent("""\
        Intro.

        <!-- doc-test: exit: 3; prints: a; prints: b c; timeout: 5 -->
        ```sh
        first
        ```

        <!-- doc-test: background; ready: 127.0.0.1:8000 localhost:9 -->

        ```bash
        second
        ```

        <!-- some other comment -->
        ```sh
        third
        ```

        ```yaml
        not: run
        ```

        ```
        output, not run
        ```

        <!-- doc-test: skip: needs a cluster; or two -->
        ```sh
        fourth
        ```
    """)
    first, second, third, fourth = blocks(text, "doc.md")
    assert (first.line, first.text, first.exit, first.prints, first.timeout) == (
        4,
        "first\n",
        3,
        ["a", "b c"],
        5.0,
    )
    assert second.background and second.ready == [("127.0.0.1", 8000), ("localhost", 9)]
    assert second.line == 10
    assert third == Block(doc="doc.md", line=15, text="third\n")
    assert fourth.skip == "needs a cluster; or two" and fourth.id == "doc.md:28"


@pytest.mark.parametrize(
    "marker",
    [
        "<!-- doc-test: printz: x -->",
        "<!-- doc-test: ready: 127.0.0.1:80 -->",  # ready without background
        "<!-- doc-test: background; ready: nowhere -->",
        "<!-- doc-test: exit: one -->",
        "<!-- doc-test: skip: -->",
    ],
)
def test_a_marker_that_is_not_understood_is_an_error(marker: str) -> None:
    with pytest.raises(MarkerError):
        blocks(f"{marker}\n```sh\ntrue\n```\n", "doc.md")


def test_a_marker_on_a_block_that_does_not_run_is_an_error() -> None:
    with pytest.raises(MarkerError, match="'yaml' block"):
        blocks("<!-- doc-test: prints: x -->\n```yaml\na: 1\n```\n", "doc.md")


def test_the_documents_are_the_readme_and_the_docs_pages(tmp_path: Path) -> None:
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    for name in ("README.md", "docs/b.md", "docs/a.md", "docs/sub/c.md", "docs/x.txt"):
        (tmp_path / name).write_text("")
    got = [str(p.relative_to(tmp_path)) for p in documents(tmp_path)]
    assert got == ["README.md", "docs/a.md", "docs/b.md", "docs/sub/c.md"]


def test_blocks_run_in_order_from_a_scratch_root_with_the_test_environment(
    tmp_path: Path,
) -> None:
    (tmp_path / "data.txt").write_text("from the repository\n")
    path = _doc(
        tmp_path,
        """\
        ```sh
        cat data.txt
        echo written > out.txt
        ```

        <!-- doc-test: prints: written; prints: epp-ok -->
        ```sh
        cat out.txt
        .venv/bin/python -c 'import epp; print("epp-ok")'
        ```

        <!-- doc-test: exit: 3; prints: oops -->
        ```sh
        echo oops >&2
        exit 3
        ```
    """,
    )
    results = run_document(path, tmp_path)
    assert [(r.passed, r.skipped) for r in results.values()] == [(True, False)] * 3
    assert not (tmp_path / "out.txt").exists()  # written in the scratch directory


def test_a_wrong_example_fails_with_what_was_expected_and_the_output(tmp_path: Path) -> None:
    path = _doc(
        tmp_path,
        """\
        ```sh
        false
        echo never
        ```

        <!-- doc-test: prints: 200 OK -->
        ```sh
        echo 404 Not Found
        ```

        <!-- doc-test: timeout: 0.5 -->
        ```sh
        sleep 30
        ```

        <!-- doc-test: skip: a cluster -->
        ```sh
        kubectl apply -f x.yaml
        ```
    """,
    )
    failed, missing, hung, skipped = run_document(path, tmp_path).values()
    assert not failed.passed and failed.detail.startswith("exit 1, expected 0")
    assert not missing.passed and "did not print ['200 OK']" in missing.detail
    assert "404 Not Found" in missing.detail
    assert not hung.passed and hung.detail.startswith("still running after 0.5 s")
    assert skipped.passed and skipped.skipped and skipped.detail == "a cluster"


def _serves(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_background_server_is_up_for_the_next_blocks_then_stopped(tmp_path: Path) -> None:
    port = free_port()
    pidfile = tmp_path / "pids"
    path = _doc(
        tmp_path,
        f"""\
        <!-- doc-test: background; ready: 127.0.0.1:{port} -->
        ```sh
        echo $$ > {pidfile}
        {sys.executable} -m http.server --bind 127.0.0.1 {port}
        ```

        <!-- doc-test: prints: Directory listing -->
        ```sh
        {sys.executable} -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:{port}/").read().decode())'
        ```
    """,
    )
    results = run_document(path, tmp_path)
    assert all(r.passed for r in results.values()), [r.detail for r in results.values()]
    assert not _serves(port)
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)


def test_a_server_that_never_gets_ready_or_dies_early_fails(tmp_path: Path) -> None:
    port = free_port()
    path = _doc(
        tmp_path,
        f"""\
        <!-- doc-test: background; ready: 127.0.0.1:{port}; timeout: 1 -->
        ```sh
        sleep 30
        ```

        <!-- doc-test: background; ready: 127.0.0.1:{port} -->
        ```sh
        echo broken config; exit 2
        ```

        <!-- doc-test: background -->
        ```sh
        exit 1
        ```

        ```sh
        sleep 0.5
        ```
    """,
    )
    never, dead, died_later, _ = run_document(path, tmp_path).values()
    assert not never.passed and f"127.0.0.1:{port} not ready in 1 s" in never.detail
    assert not dead.passed and "exited (2) before it was ready" in dead.detail
    assert "broken config" in dead.detail
    assert not died_later.passed and "exited (1) while the document ran" in died_later.detail


def test_a_fixed_port_already_taken_fails_before_starting(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = _doc(
            tmp_path,
            f"""\
            <!-- doc-test: background; ready: 127.0.0.1:{port} -->
            ```sh
            sleep 30
            ```
        """,
        )
        (result,) = run_document(path, tmp_path).values()
    assert (
        not result.passed and result.detail == f"127.0.0.1:{port} in use: stop what listens there"
    )
