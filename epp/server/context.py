"""What every ext_proc stream of one App shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from epp.config.pipeline import Pipeline
from epp.observability.decisions import DecisionLog
from epp.observability.recorder import RequestStats
from epp.requestcontrol.director import Director


@dataclass(frozen=True, slots=True)
class ServerContext:
    director: Director
    pipeline: Pipeline
    stats: RequestStats
    max_body_bytes: int = 64 << 20
    emit_scores: bool = False
    decisions: DecisionLog = field(default_factory=DecisionLog)
