"""Running the shell blocks of a markdown document, in order, each with its expected outcome.

Every fenced block whose language is ``sh`` or ``bash`` runs with ``bash -e -o pipefail`` from a
scratch directory that mirrors the repository root (a symlink to each top-level entry, and
``.venv`` pointing at the environment running the tests), so ``.venv/bin/epp`` and
``deploy/...`` resolve as they do for a reader at the root while a file a block writes
(``-o envoy.yaml``) lands in the scratch directory. That environment's ``bin`` is first on
``PATH``, as for a reader who activated it. Other blocks (output, YAML, Python) are not run.

An HTML comment on the line before a block (a reader of the rendered page does not see it) says
what to expect; clauses are separated by ``;``:

    <!-- doc-test: prints: HTTP/1.1 200; timeout: 120 -->
    <!-- doc-test: background; ready: 127.0.0.1:9002 127.0.0.1:9090 -->
    <!-- doc-test: skip: needs a Kubernetes cluster -->

- ``exit: N``: the exit status (default 0).
- ``prints: TEXT``: the output (stdout and stderr) contains TEXT; may be repeated.
- ``timeout: SECONDS``: the bound on the block (default 60 s); a block still running then fails.
- ``background``: a server the reader leaves running (in another terminal). It is started, not
  waited for; ``ready:`` lists the ``host:port`` addresses that must accept a connection (each
  free before it starts: the docs use fixed ports) before the next block runs. Every background
  block stays up until the document's last block has run, then its process group is stopped
  (SIGTERM, a second SIGTERM (the EPP drains on the first), then SIGKILL).
- ``skip: REASON``: not run here (a cluster, Docker, a run of hours, or a command another test
  runs); the reason (the rest of the comment) is reported.

A foreground block's leftover processes (a ``cmd &`` inside it) are stopped when it ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
SHELLS = ("sh", "bash")
DEFAULT_TIMEOUT = 60.0


def documents(root: Path = REPO) -> list[Path]:
    """The documents whose shell blocks are run: the README and every page under ``docs/``."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


@dataclass
class Block:
    """One shell block and what the comment before it expects."""

    doc: str
    line: int
    text: str
    exit: int = 0
    prints: list[str] = field(default_factory=list)
    timeout: float = DEFAULT_TIMEOUT
    background: bool = False
    ready: list[tuple[str, int]] = field(default_factory=list)
    skip: str = ""

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


class MarkerError(ValueError):
    pass


def _clauses(block: Block, text: str) -> None:
    if text.strip().startswith("skip:"):  # the reason is the rest, ";" included
        block.skip = text.strip().removeprefix("skip:").strip()
        if not block.skip:
            raise MarkerError(f"{block.id}: skip needs a reason")
        return
    for clause in (c.strip() for c in text.split(";")):
        if not clause:
            continue
        key, _, value = (p.strip() for p in clause.partition(":"))
        if key == "background" and not value:
            block.background = True
        elif key == "prints" and value:
            block.prints.append(value)
        elif key == "exit" and value.isdigit():
            block.exit = int(value)
        elif key == "timeout" and re.fullmatch(r"\d+(\.\d+)?", value):
            block.timeout = float(value)
        elif key == "ready" and value:
            for address in value.split():
                host, _, port = address.rpartition(":")
                if not host or not port.isdigit():
                    raise MarkerError(f"{block.id}: ready: {address!r} is not host:port")
                block.ready.append((host, int(port)))
        else:
            raise MarkerError(f"{block.id}: doc-test clause {clause!r} not understood")
    if block.ready and not block.background:
        raise MarkerError(f"{block.id}: ready: applies to a background block")


def _marker(before: str) -> str | None:
    """The clauses of a ``doc-test`` comment ending right before a block (blank lines aside)."""
    tail = before.rstrip()
    if not tail.endswith("-->"):
        return None
    comment = tail[tail.rfind("<!--") + 4 : -3].strip()
    return comment.removeprefix("doc-test:") if comment.startswith("doc-test:") else None


def blocks(text: str, doc: str) -> list[Block]:
    """The document's shell blocks in order, with their markers applied."""
    out = []
    for m in FENCE.finditer(text):
        lang, body = m.group(1), m.group(2)
        before = text[: m.start()]
        line = before.count("\n") + 1
        marker = _marker(before)
        if lang not in SHELLS:
            if marker is not None:
                raise MarkerError(f"{doc}:{line}: doc-test on a {lang or 'plain'!r} block")
            continue
        block = Block(doc=doc, line=line, text=body)
        if marker is not None:
            _clauses(block, marker)
        out.append(block)
    return out


@dataclass
class Outcome:
    block: Block
    passed: bool
    detail: str = ""  # why it failed, or why it was skipped
    skipped: bool = False


def _accepts(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the process group ``proc`` leads (SIGTERM, a second SIGTERM, then SIGKILL), each
    step bounded in time; the group is gone when no process of it is left."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader: a zombie still counts as a member
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
    proc.poll()


class Session:
    """One document's run: the scratch directory and the background blocks still up."""

    def __init__(self, workdir: Path, root: Path = REPO) -> None:
        self.workdir = workdir
        for entry in root.iterdir():
            if entry.name not in (".venv", ".git"):
                (workdir / entry.name).symlink_to(entry)
        (workdir / ".venv").symlink_to(Path(sys.prefix))
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("PYTHONPATH", None)
        self.background: list[tuple[Block, subprocess.Popen[bytes], Path]] = []

    def run(self, block: Block) -> Outcome:
        if block.skip:
            return Outcome(block, True, block.skip, skipped=True)
        if block.background:
            return self._start(block)
        return self._run(block)

    def _spawn(self, block: Block, log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen(
                ["bash", "-e", "-o", "pipefail", "-c", block.text],
                cwd=self.workdir, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def _run(self, block: Block) -> Outcome:
        log = self.workdir / f".doc-test-{block.line}.log"
        proc = self._spawn(block, log)
        try:
            code = proc.wait(timeout=block.timeout)
        except subprocess.TimeoutExpired:
            return _failed(block, f"still running after {block.timeout:g} s", log)
        finally:
            _stop(proc)
        if code != block.exit:
            return _failed(block, f"exit {code}, expected {block.exit}", log)
        return _printed(block, log)

    def _start(self, block: Block) -> Outcome:
        busy = [f"{h}:{p}" for h, p in block.ready if _accepts(h, p)]
        if busy:
            return Outcome(block, False, f"{' '.join(busy)} in use: stop what listens there")
        log = self.workdir / f".doc-test-{block.line}.log"
        proc = self._spawn(block, log)
        self.background.append((block, proc, log))
        deadline = time.monotonic() + block.timeout
        waiting = list(block.ready)
        while waiting:
            if proc.poll() is not None:
                return _failed(block, f"exited ({proc.returncode}) before it was ready", log)
            if time.monotonic() > deadline:
                what = " ".join(f"{h}:{p}" for h, p in waiting)
                return _failed(block, f"{what} not ready in {block.timeout:g} s", log)
            waiting = [(h, p) for h, p in waiting if not _accepts(h, p)]
            time.sleep(0.1)
        return _printed(block, log)

    def close(self) -> list[Outcome]:
        """Stop every background block; one that died before the end fails."""
        out = []
        for block, proc, log in self.background:
            died = proc.poll()
            _stop(proc)
            if died is not None:
                out.append(_failed(block, f"exited ({died}) while the document ran", log))
        self.background.clear()
        return out


def _printed(block: Block, log: Path) -> Outcome:
    output = log.read_text(errors="replace")
    missing = [p for p in block.prints if p not in output]
    return _failed(block, f"did not print {missing}", log) if missing else Outcome(block, True)


def _failed(block: Block, why: str, log: Path, lines: int = 40) -> Outcome:
    """A failure, with the end of the block's output."""
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return Outcome(block, False, f"{why}:\n{tail}")


def run_document(path: Path, root: Path = REPO) -> dict[str, Outcome]:
    """Every shell block of ``path``, in order: block id → outcome (a background block that died
    before the end fails, found when they are stopped after the last block)."""
    doc = str(path.relative_to(root)) if path.is_relative_to(root) else path.name
    todo = blocks(path.read_text(), doc)
    results: dict[str, Outcome] = {}
    with tempfile.TemporaryDirectory(prefix="doc-test-") as tmp:
        session = Session(Path(tmp), root)
        try:
            for block in todo:
                results[block.id] = session.run(block)
        finally:
            for failed in session.close():
                if results[failed.block.id].passed:
                    results[failed.block.id] = failed
    return results
