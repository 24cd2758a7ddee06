"""What a benchmark workload is: its requests, the simulated fleet it runs on, and how to drive it.

A workload is data, built once from a seed by a generator (``epp_tools.bench.workloads.catalog``)
and then sent unchanged to every target, so every target sees byte-identical requests in the same
order.

* ``BenchRequest``: one streamed generation request. ``session`` groups requests that must run
  one after the other (a conversation: turn ``n + 1`` is sent after turn ``n`` finished); ``at``
  is the earliest send time in *simulated* seconds after the start (0 = as soon as a slot is
  free), divided by the fleet's time scale to get wall-clock seconds; ``after`` names a request
  of another session that must have finished before this session starts (a sub-agent forks
  after its parent's turn). ``messages`` is always the whole conversation the server renders.
  ``api`` ``"chat"`` sends it to ``/v1/chat/completions``; ``"responses"`` sends it to
  ``/v1/responses``: as a new chain (the system message as ``instructions``, the rest as input
  messages) or, given the previous turn's response id, as a follow-up carrying only the last
  message (the server rebuilds the rest from its stored conversation, see ``epp_tools.sim.openai``).
* ``FleetSpec``: the ``epp sim`` parameters. They belong to the workload because they shape it:
  the KV capacity is chosen so that a router that scatters a prefix across pods forces evictions
  while one that keeps it together does not. ``pod_roles`` makes a P/D fleet: each pod's
  ``--pod-role`` and its ``llm-d.ai/role`` label in the EPP's endpoints file.
* ``Workload``: the requests, the fleet, the in-flight request cap and the scorers the ``epp``
  target adds to the built-in default profile (none unless the workload needs one, e.g. LoRA
  affinity for the multi-LoRA workload). A workload may also declare InferenceObjectives (name,
  priority): the runner writes them to an objectives file the EPP targets load; prompt prefixes
  every pod holds before the run starts (``warm_prefixes``, sent to each pod directly); a
  request class measured again alone on an idle fleet (``reference_objective``); a lead-in
  (``measure_from``) whose requests bring the fleet from idle to its steady state unmeasured;
  and a ``ForeignLoad``: traffic the driver sends straight to one pod, bypassing the router,
  while the workload runs (``epp_tools.bench.runner.foreign``). A workload with ``pd_roles`` also
  runs its P/D targets (``epp-pd``) on the same pods with those roles (``pd_fleet``), and names the
  targets a default run adds for it (``extra_targets``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

MODEL = "sim-model"
"""The base model every simulated pod serves."""

OBJECTIVE_HEADER = "x-llm-d-inference-objective"
"""InferenceObjective header: the EPP maps it to a priority (``--objectives-file``)."""
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
"""Flow-control fairness id (a tenant or a program)."""

Message = Mapping[str, str]
API_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}
ROLE_LABEL: Final = "llm-d.ai/role"
"""The endpoint label the EPP's P/D role filters read."""
POD_ROLES: Final = ("both", "prefill", "decode")


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
    pod_gpu_blocks: tuple[int, ...] = ()
    """KV blocks of each pod, overriding ``num_gpu_blocks`` (empty: every pod the same)."""
    pod_roles: tuple[str, ...] = ()
    """P/D role of each pod (empty: every pod ``both``, aggregated serving)."""
    kv_transfer_ms_per_block: float = 0.08
    """A decode pod's time to pull one KV block from a prefill pod (P/D fleets only)."""

    def __post_init__(self) -> None:
        if self.pods < 1:
            raise ValueError("pods must be >= 1")
        if self.pod_roles and len(self.pod_roles) != self.pods:
            raise ValueError("pod_roles needs one value per pod")
        if any(r not in POD_ROLES for r in self.pod_roles):
            raise ValueError(f"pod_roles must be among {', '.join(POD_ROLES)}")
        if self.pod_gpu_blocks and len(self.pod_gpu_blocks) != self.pods:
            raise ValueError("pod_gpu_blocks needs one value per pod")
        if any(b < 1 for b in self.pod_gpu_blocks):
            raise ValueError("pod_gpu_blocks must be >= 1")
        if self.time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        if self.num_gpu_blocks < 1 or self.block_size < 1:
            raise ValueError("num_gpu_blocks and block_size must be >= 1")

    @property
    def kv_tokens_per_pod(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def pod_kv_tokens(self) -> list[int]:
        """KV tokens of each pod, in pod order."""
        blocks = self.pod_gpu_blocks or (self.num_gpu_blocks,) * self.pods
        return [b * self.block_size for b in blocks]

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
        if self.pod_gpu_blocks:
            args += ["--pod-num-gpu-blocks", ",".join(map(str, self.pod_gpu_blocks))]
        if self.pod_roles:
            args += ["--pod-role", ",".join(self.pod_roles)]
            args += ["--kv-transfer-ms-per-block", f"{self.kv_transfer_ms_per_block:g}"]
        return args

    def role_labels(self) -> dict[str, dict[str, str]]:
        """Endpoint labels of a P/D fleet by pod name (``pod-<i>``); empty when aggregated."""
        return {f"pod-{i}": {ROLE_LABEL: role} for i, role in enumerate(self.pod_roles)}

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pods": self.pods,
            "num_gpu_blocks": self.num_gpu_blocks,
            "block_size": self.block_size,
            "kv_tokens_per_pod": self.kv_tokens_per_pod,
            "pod_kv_tokens": self.pod_kv_tokens,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_base_ms": self.decode_base_ms,
            "decode_per_seq_ms": self.decode_per_seq_ms,
            "time_scale": self.time_scale,
            "lora_adapters": list(self.lora_adapters),
            "max_loras": self.max_loras,
        }
        if self.pod_roles:
            out["pod_roles"] = list(self.pod_roles)
            out["kv_transfer_ms_per_block"] = self.kv_transfer_ms_per_block
        return out


@dataclass(frozen=True)
class BenchRequest:
    session: str
    turn: int
    """Position in the send order of its conversation (turn-major truncation keeps the lowest
    first); a forked sub-agent numbers its turns on from the parent turn it forked at."""
    model: str
    messages: tuple[Message, ...]
    max_tokens: int
    at: float = 0.0
    objective: str = ""
    fairness_id: str = ""
    api: str = "chat"
    """``chat`` or ``responses`` (see the module doc)."""
    after: tuple[str, int] | None = None
    """(session, turn) of another session's request this session's first request waits for."""

    def __post_init__(self) -> None:
        if self.api not in API_PATHS:
            raise ValueError(f"api must be one of {', '.join(API_PATHS)}, got {self.api!r}")

    @property
    def path(self) -> str:
        return API_PATHS[self.api]

    def headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self.objective:
            headers[OBJECTIVE_HEADER] = self.objective
        if self.fairness_id:
            headers[FAIRNESS_HEADER] = self.fairness_id
        return headers

    def body(self, previous_response_id: str = "") -> dict[str, Any]:
        """The JSON body; ``previous_response_id`` makes a Responses turn a follow-up."""
        if self.api == "responses":
            return self._responses_body(previous_response_id)
        return {
            "model": self.model,
            "messages": list(self.messages),
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def _responses_body(self, previous_response_id: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_output_tokens": self.max_tokens,
            "stream": True,
        }
        messages = list(self.messages)
        if previous_response_id:
            body["previous_response_id"] = previous_response_id
            messages = messages[-1:]
        elif messages and messages[0].get("role") == "system":
            body["instructions"] = messages.pop(0).get("content", "")
        body["input"] = [
            {"type": "message", "role": m.get("role", "user"), "content": m.get("content", "")}
            for m in messages
        ]
        return body


@dataclass(frozen=True)
class ForeignLoad:
    """Requests the router never sees: ``waiting`` more than the pod's batch holds are kept in
    flight to pod ``pod`` (closed loop), so about ``waiting`` wait in its queue."""

    pod: int = 0
    waiting: int = 10
    prompt_words: int = 200
    max_tokens: int = 512

    def as_json(self) -> dict[str, int]:
        return {
            "pod": self.pod,
            "waiting": self.waiting,
            "prompt_words": self.prompt_words,
            "max_tokens": self.max_tokens,
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
    foreign: ForeignLoad | None = None
    """Traffic sent straight to one pod while the workload runs, unseen by the router."""
    pd_roles: tuple[str, ...] = ()
    """Pod roles the P/D targets run with (empty: the workload has no P/D fleet)."""
    extra_targets: tuple[str, ...] = ()
    """Targets a run without ``--targets`` adds for this workload (e.g. ``epp-pd``)."""
    gateway_timeout: float = 300.0
    """Wall seconds the Envoy targets let a request take end to end (their route timeout)."""

    @property
    def pd_fleet(self) -> FleetSpec | None:
        """The fleet of the P/D targets: ``fleet`` with ``pd_roles`` (None without them)."""
        return replace(self.fleet, pod_roles=self.pd_roles) if self.pd_roles else None

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
