"""Per-pod configuration of the model-server simulator.

One frozen :class:`PodConfig` holds everything a simulated pod needs: where it listens, what it
serves and every parameter of the engine model. The defaults are shaped like an 8B model
(Llama-3.1-8B class, bf16) served by vLLM on one H100 80 GB:

* ``num_gpu_blocks`` 28000 x ``block_size`` 16 ~ 450k tokens: 80 GB minus ~16 GB of weights and
  activation headroom at ``gpu_memory_utilization`` 0.9 leaves ~58 GB; one token of KV costs
  2 (K,V) x 32 layers x 8 KV heads x 128 dims x 2 bytes = 128 KiB.
* ``prefill_tokens_per_s`` 16000: a compute-bound prefill at roughly 2 x 8e9 FLOP per token and
  ~30-40% of the H100's dense bf16 peak; it is also the order of llm-d's default
  ``peakPrefillThroughput`` (15928 tok/s).
* ``decode_base_ms`` 6.0: one decode step must stream the 16 GB of weights from HBM3
  (3.35 TB/s, ~5 ms) plus scheduling overhead.
* ``decode_per_seq_ms`` 0.08: each extra sequence in the batch adds its KV reads and sampling.
* ``max_num_seqs`` 256: vLLM's long-standing default for online serving.
* ``max_model_len`` 131072: the context window of Llama-3.1.
* ``kv_transfer_ms_per_block`` 0.08: pulling one block of KV from a prefill pod (P/D). A block is
  16 tokens x 128 KiB = 2 MiB; a NIXL read over one 200-400 Gb/s RDMA NIC moves ~25 GB/s, so
  ~0.08 ms a block: a 16k-token prompt (1000 blocks) moves in ~80 ms, against ~1 s to prefill it.

``role`` is the pod's part in disaggregated serving (``both``, ``prefill`` or ``decode``), see
``epp_tools.sim.disagg``.

``time_scale`` speeds the whole simulation up: with 10 every simulated duration is served in a
tenth of the wall-clock time (the engine's virtual clock runs 10x faster than the real one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EngineKind = Literal["vllm", "sglang"]
ENGINE_KINDS: tuple[EngineKind, ...] = ("vllm", "sglang")
Role = Literal["both", "prefill", "decode"]
ROLES: tuple[Role, ...] = ("both", "prefill", "decode")


@dataclass(frozen=True)
class PodConfig:
    """Everything one simulated model-server pod needs.

    ``port`` 0 picks a free port at start. ``kv_events_endpoint`` None disables KV events; the
    endpoint follows vLLM's rule (bind when it contains ``*`` or ``::`` or is ipc/inproc,
    otherwise connect).
    """

    name: str = "sim-0"
    host: str = "127.0.0.1"
    port: int = 0
    model: str = "sim-model"
    engine: EngineKind = "vllm"
    lora_adapters: tuple[str, ...] = ()
    max_loras: int = 1
    block_size: int = 16
    num_gpu_blocks: int = 28000
    max_num_seqs: int = 256
    max_model_len: int = 131072
    prefill_tokens_per_s: float = 16000.0
    decode_base_ms: float = 6.0
    decode_per_seq_ms: float = 0.08
    default_max_tokens: int = 64
    time_scale: float = 1.0
    kv_events_endpoint: str | None = None
    responses_cache_size: int = 4096
    seed: int = 0
    role: Role = "both"
    kv_transfer_ms_per_block: float = 0.08
    bos_token_id: int | None = None
    """Prepended to text completion prompts (None: none, so tokens equal the EPP's estimate)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if not self.model:
            raise ValueError("model must not be empty")
        if self.engine not in ENGINE_KINDS:
            raise ValueError(f"engine must be one of {ENGINE_KINDS}, got {self.engine!r}")
        if self.model in self.lora_adapters:
            raise ValueError("a LoRA adapter cannot have the base model's name")
        if len(set(self.lora_adapters)) != len(self.lora_adapters):
            raise ValueError("LoRA adapter names must be unique")
        positive_ints = {
            "max_loras": self.max_loras,
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "default_max_tokens": self.default_max_tokens,
            "responses_cache_size": self.responses_cache_size,
        }
        for field, value in positive_ints.items():
            if value < 1:
                raise ValueError(f"{field} must be >= 1, got {value}")
        if self.prefill_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s must be > 0")
        if self.decode_base_ms < 0 or self.decode_per_seq_ms < 0:
            raise ValueError("decode_base_ms and decode_per_seq_ms must be >= 0")
        if self.time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if not self.kv_transfer_ms_per_block >= 0:
            raise ValueError("kv_transfer_ms_per_block must be >= 0")

    @property
    def lora_enabled(self) -> bool:
        return bool(self.lora_adapters)

    @property
    def kv_events_topic(self) -> str:
        """vLLM's topic layout as the llm-d indexer expects it: ``kv@<pod>@<model>``."""
        return f"kv@{self.name}@{self.model}"


def endpoint_binds(endpoint: str) -> bool:
    """vLLM's ZMQ publisher binds for wildcard, IPv6 or local transports, otherwise connects."""
    return (
        "*" in endpoint
        or "::" in endpoint
        or endpoint.startswith("ipc://")
        or endpoint.startswith("inproc://")
    )


def offset_endpoint_port(endpoint: str, offset: int) -> str:
    """``tcp://host:5557`` with offset 2 → ``tcp://host:5559``; non-TCP or wildcard-port endpoints
    are unchanged."""
    if offset == 0 or not endpoint.startswith("tcp://"):
        return endpoint
    head, sep, port = endpoint.rpartition(":")
    if port in ("*", "0"):
        return endpoint  # the OS picks a port per socket anyway
    if not sep or not port.isdigit():
        raise ValueError(f"KV events endpoint {endpoint!r} has no numeric port")
    return f"{head}:{int(port) + offset}"
