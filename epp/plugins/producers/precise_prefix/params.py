"""Parameters of ``precise-prefix-cache-producer`` (and the deprecated
``precise-prefix-cache-scorer``), and the pod label selector; see
``epp.plugins.producers.precise_prefix.producer`` for what each one does."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from epp.plugin.units import parse_duration

DEFAULT_INDEX_SIZE: Final = 100_000_000


@dataclass(frozen=True)
class TokenProcessorConfig:
    block_size_tokens: int = 16
    block_size: int = 0
    hash_seed: str = ""
    hash_algorithm: Literal["cbor-fnv", "xxh64"] = "cbor-fnv"

    def __post_init__(self) -> None:
        if self.block_size_tokens <= 0 or self.block_size < 0:
            raise ValueError("blockSizeTokens must be > 0 and blockSize >= 0")

    @property
    def effective_block_size(self) -> int:
        """``blockSize`` (deprecated) applies only when ``blockSizeTokens`` is the default."""
        if self.block_size > 0 and self.block_size_tokens == 16:
            return self.block_size
        return self.block_size_tokens


@dataclass(frozen=True)
class InMemoryConfig:
    size: int = DEFAULT_INDEX_SIZE
    pod_cache_size: int = 10

    def __post_init__(self) -> None:
        if self.size <= 0 or self.pod_cache_size <= 0:
            raise ValueError("inMemoryConfig.size and podCacheSize must be > 0")


@dataclass(frozen=True)
class KVBlockIndexConfig:
    in_memory_config: InMemoryConfig = field(default_factory=InMemoryConfig)
    enable_metrics: bool = False
    metrics_logging_interval: int | str = 0
    """Upstream's ``time.Duration``: integer nanoseconds (``60000000000`` = 1 m); a Go duration
    string (``1m``) is accepted too. Zero or negative = no logging."""

    def __post_init__(self) -> None:
        _seconds(self.metrics_logging_interval)

    @property
    def metrics_logging_seconds(self) -> float:
        """The logging interval in seconds (``<= 0``: off)."""
        return _seconds(self.metrics_logging_interval)


def _seconds(value: int | str) -> float:
    """Integer nanoseconds (Go's ``time.Duration`` in JSON) or a duration string → seconds."""
    if isinstance(value, int):
        return value / 1e9
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"metricsLoggingInterval: {exc}") from None


@dataclass(frozen=True)
class IndexerConfig:
    kv_block_index_config: KVBlockIndexConfig = field(default_factory=KVBlockIndexConfig)


@dataclass(frozen=True)
class PodDiscoveryConfig:
    pod_label_selector: str = ""
    pod_namespace: str = ""
    socket_port: int = 5557
    replay_socket_port: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.socket_port <= 65535:
            raise ValueError(f"socketPort must be in [1, 65535], got {self.socket_port}")
        if self.replay_socket_port:
            raise ValueError("replaySocketPort: resync from a replay socket is not supported")
        parse_selector(self.pod_label_selector)


@dataclass(frozen=True)
class KVEventsConfig:
    zmq_endpoint: str = ""
    topic_filter: str = "kv@"
    concurrency: int = 4
    engine_type: Literal["vllm", "sglang"] = "vllm"
    discover_pods: bool = True
    pod_discovery_config: PodDiscoveryConfig = field(default_factory=PodDiscoveryConfig)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.zmq_endpoint and "://" not in self.zmq_endpoint:
            raise ValueError(
                f"zmqEndpoint must be a ZMQ URL (tcp://host:port), got {self.zmq_endpoint!r}"
            )


@dataclass(frozen=True)
class PreciseParams:
    token_processor_config: TokenProcessorConfig = field(default_factory=TokenProcessorConfig)
    indexer_config: IndexerConfig = field(default_factory=IndexerConfig)
    kv_events_config: KVEventsConfig = field(default_factory=KVEventsConfig)
    speculative_indexing: bool = False
    speculative_ttl: str = field(default="2s", metadata={"yaml": "speculativeTTL"})

    def __post_init__(self) -> None:
        if parse_duration(self.speculative_ttl) <= 0:
            raise ValueError(f"speculativeTTL must be > 0, got {self.speculative_ttl!r}")


@dataclass(frozen=True, slots=True)
class _Term:
    key: str
    op: Literal["=", "!=", "exists", "absent"]
    value: str = ""

    def holds(self, labels: Mapping[str, str]) -> bool:
        if self.op == "=":
            return labels.get(self.key) == self.value
        if self.op == "!=":
            return labels.get(self.key) != self.value
        return (self.key in labels) == (self.op == "exists")


def parse_selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """A label selector of comma-separated ``k=v`` / ``k==v`` / ``k!=v`` / ``k`` / ``!k`` terms
    (all must hold); ``""`` selects everything. ``ValueError`` on a malformed term."""
    terms: list[_Term] = []
    for raw in text.split(","):
        term = raw.strip()
        if not term:
            continue
        if "!=" in term:
            key, value = term.split("!=", 1)
            parsed = _Term(key.strip(), "!=", value.strip())
        elif "=" in term:
            key, value = term.split("=", 1)
            parsed = _Term(key.strip(), "=", value.lstrip("=").strip())
        elif term.startswith("!"):
            parsed = _Term(term[1:].strip(), "absent")
        else:
            parsed = _Term(term, "exists")
        if not parsed.key:
            raise ValueError(f"podLabelSelector: term {term!r} has no label key")
        terms.append(parsed)
    return lambda labels: all(t.holds(labels) for t in terms)
