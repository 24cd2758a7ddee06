"""The peer routers from PyPI, each in a virtualenv of its own at the repository root.

* ``sglang-router`` (``.venv-sglang-router``, ``sglang-router==0.3.*``), policy ``cache_aware``;
* ``vllm-router`` (``.venv-vllm-router``, ``vllm-router==0.1.*``), policy ``cache_aware``.

Both ship a prebuilt Rust extension in their wheel; the runner creates the venv and
``pip install``s the router the first time the target is used, and reuses it afterwards. The
minor versions are pinned to the ones whose behaviour is known (traps below).

Traps handled here:

* sglang-router binds ``0.0.0.0`` by default: ``--host`` and ``--prometheus-host`` are set to
  127.0.0.1;
* at start it tries to download a tokenizer for the served model from a model hub: the proxy
  variables point at a loopback port nobody listens on, so that fails at once (``NO_PROXY``
  keeps the workers reachable);
* it does not set TCP_NODELAY on accepted client sockets, which adds about 40 ms to streamed
  responses on reused connections: the runner's fresh-connection probe reports TTFT without it;
* vllm-router's ``cache_aware`` calls ``/v1/chat/completions/render`` on every worker for every
  request (the simulator serves it), which costs it latency at large prompts.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from epp_tools.stack.envoy import free_port
from epp_tools.stack.eppconfig import CHECKOUT

_INSTALL_TIMEOUT = 600.0


class PeerUnavailable(Exception):
    """The peer cannot be installed or started; the message says why."""


@dataclass(frozen=True)
class PeerSpec:
    key: str
    label: str
    venv: str
    requirement: str
    console: str

    def binary(self, root: Path) -> Path:
        return root / self.venv / "bin" / self.console

    def argv(self, root: Path, port: int, metrics_port: int, workers: Sequence[str]) -> list[str]:
        common = [
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(metrics_port),
            "--worker-urls",
            *workers,
            "--policy",
            "cache_aware",
        ]
        if self.key == "sglang":
            extra = ["--log-level", "warn", "--shutdown-grace-period-secs", "1"]
            return [str(self.binary(root)), "launch", *common, *extra]
        return [str(self.binary(root)), *common, "--log-level", "warning"]


SGLANG = PeerSpec(
    "sglang", "sglang-router cache_aware", ".venv-sglang-router", "sglang-router==0.3.*",
    "sglang-router",
)  # fmt: skip
VLLM = PeerSpec(
    "vllm", "vllm-router cache_aware", ".venv-vllm-router", "vllm-router==0.1.*", "vllm-router"
)


def repo_root() -> Path:
    """The source checkout ``epp`` runs from (where the peer venvs live), else the cwd."""
    return CHECKOUT if (CHECKOUT / "pyproject.toml").is_file() else Path.cwd()


def no_egress_env() -> dict[str, str]:
    """Proxy variables pointing at a dead loopback port, loopback exempted."""
    dead = f"http://127.0.0.1:{free_port()}"
    env = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = dead
        env[name.lower()] = dead
    return env


def _run(argv: Sequence[str], what: str) -> None:
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=_INSTALL_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerUnavailable(f"{what}: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise PeerUnavailable(f"{what} failed ({done.returncode}): {' | '.join(tail)}")


def ensure_installed(spec: PeerSpec, root: Path) -> Path:
    """The peer's binary, creating its venv and installing it on first use."""
    binary = spec.binary(root)
    if binary.exists():
        return binary
    venv = root / spec.venv
    print(f"bench: installing {spec.requirement} into {venv} (first use)", flush=True)
    if not (venv / "bin" / "python").exists():
        _run([sys.executable, "-m", "venv", str(venv)], f"creating {venv}")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", spec.requirement]
    _run(pip, f"pip install {spec.requirement}")
    if not binary.exists():
        raise PeerUnavailable(f"{spec.requirement} installed no {spec.console} script")
    return binary
