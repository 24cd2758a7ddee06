"""The flow-control policy contract: what fairness, ordering and usage-limit policies see and do.

Flow control queues each admitted request as a ``QueuedRequest`` in the flow
``(fairness_id, priority)`` of the priority band for its priority. Each dispatch cycle walks the
bands from the highest priority down; in a band the *fairness policy* chooses a flow and the
*ordering policy* decides which request is that flow's head. The *usage-limit policy* gives every
band a saturation ceiling; a band whose ceiling is at or below the pool saturation stops the cycle.

With ``flowControl.enableEviction``, requests already dispatched may be revoked to free capacity
for a gated band: the *eviction filter policy* decides, at dispatch, whether a request may ever be
evicted (``EvictionItem``), and the *eviction ordering policy* which candidate goes first.

Policies are plugins like any other (``PluginBase`` + ``Params``) and are found by the roles below
(``typing.Protocol``). The method names deliberately avoid those of the scheduling roles
(``pick``, ``filter``, ``score``...), so a policy is never slotted into a scheduling profile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from epp.plugin import TOKENIZED_PROMPT, Endpoint, InferenceRequest, TokenizedPrompt, TypedName

BYTES_PER_TOKEN = 4
"""Token estimate for bodies nobody tokenized (the same ratio as the ``estimate`` tokenizer)."""


def prompt_tokens(request: InferenceRequest) -> int:
    """The request's prompt size in tokens: from a ``TokenizedPrompt`` attribute when a producer
    published one, else ``ceil(size_bytes / 4)``."""
    prefix = TOKENIZED_PROMPT + "/"
    for key, value in request.attributes.items():
        if key.startswith(prefix) and isinstance(value, TokenizedPrompt):
            return value.token_count
    return -(-request.size_bytes // BYTES_PER_TOKEN)


@dataclass(slots=True, eq=False)
class QueuedRequest:
    """One request waiting in (or dispatched from) a flow queue.

    ``enqueue_time`` is the controller's clock reading at enqueue; ``ttl`` is the queue-wait
    budget in seconds (``0`` = none); ``seq`` is a unique, increasing arrival number that breaks
    ties. ``priority`` is the band the request waits in (its objective priority, possibly
    boosted); ``outcome`` is empty until the request leaves the queue.
    """

    request: InferenceRequest
    candidates: Callable[[], Sequence[Endpoint]]
    fairness_id: str
    priority: int
    enqueue_time: float
    ttl: float
    size_bytes: int
    seq: int
    outcome: str = ""
    regime_empty: bool = False
    regime_since: float = 0.0


class FlowView(Protocol):
    """A non-empty flow queue as a fairness policy sees it."""

    @property
    def flow_id(self) -> str: ...

    def __len__(self) -> int: ...

    def peek(self) -> QueuedRequest | None: ...

    def head_key(self) -> tuple[Any, ...]:
        """The ordering key of the head (comparable across flows of one band)."""
        ...


class BandView(Protocol):
    """A priority band as a fairness policy sees it: its flows and its policy state."""

    @property
    def priority(self) -> int: ...

    @property
    def state(self) -> Any:
        """Whatever the band's fairness policy returned from ``new_state()``."""
        ...

    def active_flows(self) -> Iterable[FlowView]:
        """The non-empty flows, in the order they were created."""
        ...


@runtime_checkable
class OrderingPolicy(Protocol):
    """Orders requests within one flow: the smallest key is dispatched first."""

    typed_name: TypedName

    def order_key(self, item: QueuedRequest) -> tuple[float, ...]: ...


@runtime_checkable
class FairnessPolicy(Protocol):
    """Chooses which flow of a band dispatches next.

    ``select_flow`` must not change state: the band may still be gated after the choice.
    ``on_dispatch`` commits the choice once the head of ``flow`` was really dispatched.
    ``on_complete`` reports a finished request of ``fairness_id`` (token counts for policies that
    account service).
    """

    typed_name: TypedName

    def new_state(self) -> Any: ...

    def select_flow(self, band: BandView, now: float) -> FlowView | None: ...

    def on_dispatch(
        self, band: BandView, flow: FlowView, item: QueuedRequest, now: float
    ) -> None: ...

    def on_complete(
        self, fairness_id: str, input_tokens: int, output_tokens: int, now: float
    ) -> None: ...


@runtime_checkable
class UsageLimitPolicy(Protocol):
    """Computes one saturation ceiling per priority band, once per dispatch cycle.

    ``priorities`` are the provisioned bands, highest first. The result holds one ceiling in
    ``[0, 1]`` per priority, non-increasing; a band is gated while ``saturation >= ceiling``.
    Missing entries count as ``1.0`` (no gating).
    """

    typed_name: TypedName

    def compute_limit(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]: ...


@runtime_checkable
class PriorityAdjuster(Protocol):
    """Changes the band a request waits in (e.g. ``turn-priority``) and learns its lifecycle."""

    typed_name: TypedName

    def adjusted_priority(self, request: InferenceRequest, now: float) -> int: ...

    def on_dispatch(self, request: InferenceRequest, now: float) -> None: ...

    def on_done(self, request: InferenceRequest, now: float) -> None: ...


@dataclass(frozen=True, slots=True)
class EvictionItem:
    """A request flow control dispatched to a model server, as eviction policies see it.

    ``dispatched_at`` is the controller's clock reading at dispatch; ``seq`` the request's
    arrival number (unique, increasing), which breaks ties between equal dispatch times.
    """

    request: InferenceRequest
    priority: int
    fairness_id: str
    dispatched_at: float
    seq: int


@runtime_checkable
class EvictionFilterPolicy(Protocol):
    """Which dispatched requests may be evicted at all (upstream's ``EvictionFilterPolicy``):
    asked once, at dispatch; a request it refuses is never a victim. Victims are further always
    below the priority of the band that needs the capacity."""

    typed_name: TypedName

    def evictable(self, item: EvictionItem) -> bool: ...


@runtime_checkable
class EvictionOrderingPolicy(Protocol):
    """Which eviction candidate goes first: the smallest key (upstream's ``Less``, as a key)."""

    typed_name: TypedName

    def eviction_key(self, item: EvictionItem) -> tuple[float, ...]: ...
