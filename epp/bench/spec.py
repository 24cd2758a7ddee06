"""What a benchmark workload is: its requests, the simulated fleet it runs on, and how to drive it.

A workload is data, built once from a seed by a generator (``epp.bench.workloads``) and then sent
unchanged to every target, so every target sees byte-identical requests in the same order.

* ``BenchRequest``: one streamed chat completion. ``session`` groups requests that must run one
  after the other (a conversation: turn ``n + 1`` is sent after turn ``n`` finished); ``at`` is
  the earliest send time in *simulated* seconds after the start (0 = as soon as a slot is free),
  divided by the fleet's time scale to get wall-clock seconds.
* ``FleetSpec``: the ``epp sim`` parameters. They belong to the workload because they shape it:
  the KV capacity is chosen so that a router that scatters a prefix across pods forces evictions
  while one that keeps it together does not.
* ``Workload``: the requests, the fleet, the in-flight request cap and the scorers the ``epp``
  target adds to the built-in default profile (none unless the workload needs one, e.g. LoRA
  affinity for the multi-LoRA workload). A workload may also declare InferenceObjectives (name,
  priority): the runner writes them to an objectives file the EPP targets load; prompt prefixes
  every pod holds before the run starts (``warm_prefixes``, sent to each pod directly); and a
  request class measured again alone on an idle fleet (``reference_objective``); and a lead-in
  (``measure_from``) whose requests bring the fleet from idle to its steady state unmeasured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MODEL = "sim-model"
"""The base model every simulated pod serves."""

OBJECTIVE_HEADER = "x-llm-d-inference-objective"
"""InferenceObjective header: the EPP maps it to a priority (``--objectives-file``)."""
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
"""Flow-control fairness id (a tenant or a program)."""

Message = Mapping[str, str]


@dataclass(frozen=True)
class FleetSpec:
    pods: int = 4
    num_gpu_blocks: int = 28000
    block_size: int = 16
    max_num_seqs: int = 256
    max_model_len: int = 131072
    prefill_tokens_per_s: float = 16000.0
    time_scale: float = 10.0
    decode_base_ms: float = 6.0
    decode_per_seq_ms: float = 0.08
    lora_adapters: tuple[str, ...] = ()
    max_loras: int = 1

    def __post_init__(self) -> None:
        if self.pods < 1:
            raise ValueError("pods must be >= 1")
        if self.time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        if self.num_gpu_blocks < 1 or self.block_size < 1:
            raise ValueError("num_gpu_blocks and block_size must be >= 1")

    @property
    def kv_tokens_per_pod(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def sim_args(self) -> list[str]:
        """Arguments of ``epp sim`` (ports picked by the OS, pods named ``pod-<i>``)."""
        args = [
            "--pods",
            str(self.pods),
            "--port",
            "0",
            "--pod-name-prefix",
            "pod-",
            "--model",
            MODEL,
            "--time-scale",
            f"{self.time_scale:g}",
            "--num-gpu-blocks",
            str(self.num_gpu_blocks),
            "--block-size",
            str(self.block_size),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-model-len",
            str(self.max_model_len),
            "--prefill-tokens-per-s",
            f"{self.prefill_tokens_per_s:g}",
            "--decode-base-ms",
            f"{self.decode_base_ms:g}",
            "--decode-per-seq-ms",
            f"{self.decode_per_seq_ms:g}",
        ]
        if self.lora_adapters:
            args += ["--lora", ",".join(self.lora_adapters), "--max-loras", str(self.max_loras)]
        return args

    def as_json(self) -> dict[str, Any]:
        return {
            "pods": self.pods,
            "num_gpu_blocks": self.num_gpu_blocks,
            "block_size": self.block_size,
            "kv_tokens_per_pod": self.kv_tokens_per_pod,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_base_ms": self.decode_base_ms,
            "decode_per_seq_ms": self.decode_per_seq_ms,
            "time_scale": self.time_scale,
            "lora_adapters": list(self.lora_adapters),
            "max_loras": self.max_loras,
        }


@dataclass(frozen=True)
class BenchRequest:
    session: str
    turn: int
    model: str
    messages: tuple[Message, ...]
    max_tokens: int
    at: float = 0.0
    objective: str = ""
    fairness_id: str = ""

    def headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self.objective:
            headers[OBJECTIVE_HEADER] = self.objective
        if self.fairness_id:
            headers[FAIRNESS_HEADER] = self.fairness_id
        return headers

    def body(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": list(self.messages),
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }


@dataclass
class Workload:
    name: str
    title: str
    description: str
    requests: list[BenchRequest]
    fleet: FleetSpec
    concurrency: int
    epp_extra_scorers: tuple[tuple[str, int], ...] = ()
    """(scorer type, weight) added to the EPP's default profile for this workload."""
    shape: dict[str, Any] = field(default_factory=dict)
    objectives: tuple[tuple[str, int], ...] = ()
    """InferenceObjectives (name, priority) the EPP targets load from a generated file."""
    warm_prefixes: tuple[tuple[Message, ...], ...] = ()
    """Prompts sent once to every pod (bypassing the router) before the measured phase."""
    reference_objective: str = ""
    """Objective whose requests are also run alone on an idle fleet (the latency reference)."""
    measure_from: float = 0.0
    """Lead-in: requests arriving earlier (simulated seconds) are sent and served but left out
    of the per-class and per-tenant statistics."""

    def objectives_yaml(self) -> str:
        """The declared objectives as multi-document ``InferenceObjective`` YAML."""
        docs = [
            f"apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\n"
            f"metadata: {{name: {name}}}\nspec: {{priority: {priority}}}\n"
            for name, priority in self.objectives
        ]
        return "---\n".join(docs)

    def sessions(self) -> dict[str, list[BenchRequest]]:
        """Requests per session, in send order (sessions in order of their first request)."""
        out: dict[str, list[BenchRequest]] = {}
        for r in self.requests:
            out.setdefault(r.session, []).append(r)
        return out


def limit_requests(requests: Sequence[BenchRequest], n: int) -> list[BenchRequest]:
    """The first ``n`` requests in send order, never keeping a turn without its predecessors.

    Requests are taken turn-major (every session's first turn, then every second turn, ...), so
    a short run still exercises every session that fits rather than one long conversation.
    """
    if n <= 0 or n >= len(requests):
        return list(requests)
    order = sorted(range(len(requests)), key=lambda i: (requests[i].turn, i))
    keep = set(order[:n])
    return [r for i, r in enumerate(requests) if i in keep]
