"""Routing facts shared between EPP replicas (active-active, ``epp --workers N``).

Each replica learns routing facts from its own traffic: which prompt blocks it sent where
(approximate prefix index), how many requests it has in flight on each endpoint, session and
Responses API bindings. With several replicas, each must also know what the others learned, or
prefix affinity and sessions break as soon as two replicas share a pool.

A plugin that keeps such state implements ``SharedState``. When a cross-replica syncer is
configured (``dataLayer.crossReplicaSyncerPluginRef``, e.g. ``redis-syncer``), the sync engine
calls it from its background tasks, at least every ``crossReplicaSyncInterval`` (200 ms), and
within milliseconds of the plugin calling ``Handle.share_soon()``:

- ``export_facts()`` hands over what the plugin learned since the last call (and clears it). The
  facts are JSON values (dicts, lists, strings, numbers): compact, self-describing, and bounded by
  the plugin (a burst of learning is capped, oldest first). The engine calls it once when it is
  created, before any traffic, and without a syncer never: a plugin queues facts for export only
  from its first call on, so a lone replica keeps nothing for peers it does not have.
- ``apply_facts(facts, origin)`` merges facts another replica (``origin``, a stable replica id)
  published into local state. It must tolerate loss, duplicates and reordering: the transport is
  at-least-once over a bounded log, and a replica that starts late replays the log's tail.

Both are synchronous and called on the event loop, never on the request path: they must be quick.
A plugin that has just learned something a peer may need at once (a binding a follow-up request
will look for, a prompt's new blocks) calls ``self.handle.share_soon()`` after recording it: a
flag set, so it may be called on every request; the engine then exports and publishes at once
(publishes stay at least 5 ms apart, up to 20 ms under load). Facts learned without it wait for the
next interval.
Facts travel between replicas keyed by the plugin's configured name, so replicas must run the
same configuration. A plugin with nothing to share does not implement the protocol.

The transport is a ``ReplicaSyncer`` (below); the engine that drives both is ``epp.state.sync``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from epp.plugin.types import TypedName


@runtime_checkable
class SharedState(Protocol):
    """A plugin whose routing facts other replicas should apply (see the module docstring)."""

    typed_name: TypedName

    def export_facts(self) -> list[Any]: ...

    def apply_facts(self, facts: Sequence[Any], origin: str) -> None: ...


class Delivery(NamedTuple):
    """One batch read back from the shared log: who published it and its facts by plugin name."""

    origin: str
    batch: dict[str, list[Any]]


@runtime_checkable
class ReplicaSyncer(Protocol):
    """The transport that carries batches of facts between replicas
    (``dataLayer.crossReplicaSyncerPluginRef``; ``redis-syncer`` is the built-in one).

    The model is one shared, bounded, append-only log per pool. The engine (``epp.state``) drives
    it from two tasks, never on the request path: one publishes, the other replays and receives.
    So ``publish`` may run while a ``receive`` (or ``replay``) waits, and a transport keeps the two
    apart (e.g. one connection each); neither is ever called concurrently with itself, and
    ``replay`` and ``receive`` never with each other:

    - ``replica_id``: this replica's identity, unique among the replicas and stable for the life
      of the instance (e.g. pod name plus a random suffix: a restarted replica is a new one).
    - ``bind(pool)``: called once, before any I/O, with the identity of the pool this EPP serves
      (``<namespace>/<pool name>``); a transport keeps pools apart by it unless told otherwise.
    - ``bootstrap_timeout``: seconds a starting replica waits for its first successful
      ``replay`` before it reports ready anyway (so the transport being down never keeps the EPP
      unready).
    - ``publish(batch)``: appends one batch (plugin name → facts, JSON values) to the log.
    - ``receive(wait)``: the batches appended since the cursor, oldest first, from every origin
      (this replica's own included: the engine skips them), at most a bounded number per call;
      moves the cursor past them. With none there yet and ``wait`` > 0, it waits up to ``wait``
      seconds for the first new ones and returns as soon as they are appended (``redis-syncer``:
      ``XREAD BLOCK``), so peers' facts apply within a round trip of their publication; it may
      return empty sooner. ``wait`` 0 returns at once. Without a prior ``replay`` the cursor
      starts at the log's end.
    - ``replay()``: the log's tail (bounded), oldest first, for a replica that starts; moves the
      cursor to the end of what it returned, so ``receive`` continues from there.

    Every call is bounded in time by the transport's own timeout (plus ``wait``). An exception
    means "the transport is unavailable": nothing was appended (``publish``; the engine keeps the
    batch and retries it), the cursor did not move (``receive``, ``replay``). A ``receive``
    cancelled while it waits (the App stopping) leaves the cursor where it was. Delivery is
    at-least-once and the log is bounded, so facts may be lost, duplicated or reordered;
    ``SharedState`` copes. Connections are opened lazily and closed by ``Lifecycle.stop`` when the
    syncer implements it.
    """

    typed_name: TypedName

    @property
    def replica_id(self) -> str: ...

    @property
    def bootstrap_timeout(self) -> float: ...

    def bind(self, pool: str) -> None: ...

    async def publish(self, batch: Mapping[str, Sequence[Any]]) -> None: ...

    async def receive(self, wait: float = 0.0) -> list[Delivery]: ...

    async def replay(self) -> list[Delivery]: ...
