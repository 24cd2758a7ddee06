"""What the supervisor tells a worker, and what a worker tells the supervisor.

- The worker's ``Settings`` travel as one JSON object on the worker's stdin (then closed): the
  supervisor's own settings with ``workers=1``, the group's concrete ext_proc port, ephemeral
  (port 0) health and metrics ports, and the group's certificate directory. No hidden flags, so
  ``epp --help`` shows only what an operator sets, and the config text is read once, by the
  supervisor, so every worker runs the same configuration even if the file changes meanwhile.
- ``EPP_WORKER_INDEX`` (0..N-1) and ``EPP_WORKERS`` (N) are set in the worker's environment, for
  its log lines and for anything that must tell the workers of one host apart.
- The worker answers with one JSON line on its stdout once its servers listen
  (:class:`WorkerReport`): the ports it actually bound.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Final

from epp.settings import Settings

INDEX_ENV: Final = "EPP_WORKER_INDEX"
COUNT_ENV: Final = "EPP_WORKERS"


def encode_settings(settings: Settings) -> str:
    return json.dumps(dataclasses.asdict(settings))


def decode_settings(text: str) -> Settings:
    """The inverse of :func:`encode_settings` (JSON lists become the tuples ``Settings`` holds);
    a key ``Settings`` does not have is a ``ValueError``."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("worker settings: expected a JSON object")
    names = {f.name for f in dataclasses.fields(Settings)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ValueError(f"worker settings: unknown fields {unknown}")
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    return Settings(**values)


@dataclass(frozen=True)
class WorkerReport:
    """A worker's ports, sent once its ext_proc, health and metrics servers listen."""

    pid: int
    grpc_port: int
    health_port: int
    metrics_port: int

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self)) + "\n"

    @classmethod
    def decode(cls, line: str) -> WorkerReport:
        raw = json.loads(line)
        if not isinstance(raw, dict):
            raise ValueError("worker report: expected a JSON object")
        return cls(**{f.name: int(raw[f.name]) for f in dataclasses.fields(cls)})
