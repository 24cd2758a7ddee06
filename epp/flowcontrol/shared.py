"""Flow-control occupancy shared between EPP replicas (active-active), and what it may gate.

Every replica queues its own requests. The flow controller shares how many wait in each of its
priority bands through the cross-replica syncer: it takes part in the sync loop like a plugin
(``epp.plugin.SharedState``), with ``typed_name`` ``FLOW_CONTROL_NAME`` (type and name
``flow-control``), so its facts travel under the name ``flow-control``; no plugin should be
configured under that name. Its ``export_facts`` / ``apply_facts`` delegate to ``PeerOccupancy``.

A fact is the replica's whole queue occupancy (bands with nothing queued left out)::

    {"src": <random id of the process>, "v": [<run epoch ms>, <n>],
     "bands": {"<priority>": [<requests>, <bytes>], ...}}

exported when it changed since the last export, and at least every ``heartbeat`` (1 s) even when
it did not. The receiver keeps each origin's newest fact only (``v`` orders one replica's facts,
across its restarts too), so duplicates and reordered facts change nothing and a lost one is
healed by the next; facts this process published are ignored; an origin that sends nothing newer
for ``peer_ttl`` (5 s) is forgotten (checked at every sync round, which exports even while the
transport is down, and by the priority gate at every dispatch cycle). The peers' view is one
sync interval (200 ms) plus transport old; the gauges below are set at every sync round.

What the global view changes:

- By default, nothing gates on it: each replica admits, queues and dispatches exactly as alone.
  It is exposed in ``llm_d_epp_flow_control_cross_replica_queue_size{priority, inference_pool}``
  (requests queued in that band here plus at every live peer as last reported) and
  ``llm_d_epp_flow_control_cross_replica_peers{inference_pool}`` (peers heard from).
- Saturation needs no sharing: detectors read the model servers' scraped state, which shows
  every replica's dispatches. (A reserving detector such as ``concurrency-detector`` counts this
  replica's dispatches only: it is a plugin, and sharing its count is its own business.)
- ``pool_wide_max_requests`` (off by default): ``flowControl.maxRequests`` and each band's
  ``maxRequests`` (default 5000) bound the requests queued across all replicas, this one's plus
  the peers' last reported, instead of per replica. The cap may be overshot by what the other
  replicas admit within one sync interval. ``maxBytes`` stays per replica: it bounds this
  process's memory.
- ``pool_wide_priority`` (off by default): strict priority across replicas. A band whose head
  could dispatch waits while a peer reports requests queued in a strictly higher band (equal
  priorities compete as before), just as it waits for this replica's own higher bands. Without
  it, when the shared pool frees room, every replica dispatches its best band, so one replica's
  sheddable requests take room another replica's critical ones were waiting for. Costs: the hold
  outlasts the peer's backlog by one sync interval (up to ``peer_ttl`` if the peer dies); it
  assumes every replica's requests compete for the same endpoints (a peer's band waiting on a
  saturated subset of the pool still holds this replica's lower bands).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.metrics import FlowControlMetrics
from epp.flowcontrol.queues import Band
from epp.plugin import TypedName

FLOW_CONTROL_NAME: Final = TypedName(type="flow-control", name="flow-control")
MAX_BANDS: Final = 256
"""Bands one fact lists at most (a fact with more is ignored as malformed)."""
MAX_PEERS: Final = 256


@dataclass(frozen=True)
class CrossReplicaOptions:
    """How the flow controller uses the other replicas' occupancy (see the module docstring)."""

    pool_wide_max_requests: bool = False
    pool_wide_priority: bool = False
    peer_ttl: float = 5.0
    heartbeat: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat < self.peer_ttl:
            raise ValueError("cross-replica heartbeat must be > 0 and shorter than the peer TTL")


@dataclass
class _Peer:
    heard: float  # when its newest fact arrived (this replica's clock)
    version: tuple[int, int] = (0, 0)
    bands: dict[int, tuple[int, int]] = field(default_factory=dict)


class PeerOccupancy:
    """This replica's facts out, the peers' in (see the module docstring)."""

    def __init__(
        self, options: CrossReplicaOptions, config: FlowControlConfig, metrics: FlowControlMetrics
    ) -> None:
        self.options = options
        self._config = config
        self.token = secrets.token_hex(8)
        self._epoch = int(time.time() * 1000)  # orders this run after the replica's earlier ones
        self._n = 0
        self._sent: dict[str, list[int]] | None = None
        self._sent_at = -math.inf
        self._peers: dict[str, _Peer] = {}
        self._check_at = math.inf
        self._metrics = metrics
        self._labelled: set[int] = set()
        self.bands: dict[int, tuple[int, int]] = {}  # the peers' (requests, bytes) by priority
        self.queued = 0  # the peers' queued requests, all bands
        self.top: int | None = None  # the highest priority a peer has requests queued in

    @property
    def peers(self) -> int:
        return len(self._peers)

    # ---- facts --------------------------------------------------------------------------------

    def export(self, bands: Mapping[int, Band], now: float) -> list[Any]:
        state = {str(p): [b.live, b.bytes] for p, b in bands.items() if b.live}
        if state == self._sent and now - self._sent_at < self.options.heartbeat:
            return []
        self._sent, self._sent_at = state, now
        self._n += 1
        return [{"src": self.token, "v": [self._epoch, self._n], "bands": state}]

    def apply(self, facts: Sequence[Any], origin: str, now: float) -> None:
        changed = False
        for fact in facts:
            parsed = _parse(fact)
            if parsed is None or parsed[0] == self.token:
                continue
            _, version, bands = parsed
            peer = self._peers.get(origin)
            if peer is not None and version <= peer.version:
                continue  # a duplicate, or older than what is held
            if peer is None:
                if len(self._peers) >= MAX_PEERS:
                    continue
                peer = self._peers[origin] = _Peer(now)
            peer.version, peer.heard, peer.bands = version, now, bands
            changed = True
        if changed:
            self._retotal()
        self.expire(now)

    def expire(self, now: float) -> None:
        """Forget peers that sent nothing newer for longer than the TTL."""
        if now <= self._check_at:
            return
        ttl = self.options.peer_ttl
        silent = [o for o, p in self._peers.items() if now - p.heard > ttl]
        for origin in silent:
            del self._peers[origin]
        self._retotal()

    # ---- gates --------------------------------------------------------------------------------

    def holds(self, priority: int, now: float) -> bool:
        """``pool_wide_priority``: a peer has requests queued in a band above ``priority``."""
        if not self.options.pool_wide_priority:
            return False
        self.expire(now)
        return self.top is not None and self.top > priority

    def has_capacity(self, band: Band, queued: int, queued_bytes: int, size: int) -> bool:
        """Room for a request of ``size`` bytes in ``band`` (``queued``: this replica's total),
        counting the peers' queued requests under ``pool_wide_max_requests``."""
        peers, config = self.options.pool_wide_max_requests, self._config
        if config.max_bytes and queued_bytes + size > config.max_bytes:
            return False
        if config.max_requests and queued + 1 + (self.queued if peers else 0) > config.max_requests:
            return False
        limits = band.config
        if limits.max_bytes and band.bytes + size > limits.max_bytes:
            return False
        peer_band = self.bands.get(band.priority, (0, 0))[0] if peers else 0
        return not (limits.max_requests and band.live + 1 + peer_band > limits.max_requests)

    # ---- metrics ------------------------------------------------------------------------------

    def record(self, bands: Mapping[int, Band], now: float) -> None:
        """Forget silent peers, then set the cross-replica gauges: every band known here or at
        a peer (called every sync round, the view's own pace)."""
        self.expire(now)
        priorities = set(bands) | set(self.bands)
        queued = {
            p: (b.live if (b := bands.get(p)) else 0) + self.bands.get(p, (0, 0))[0]
            for p in priorities
        }
        self._metrics.record_cross_replica(queued, self._labelled - priorities, len(self._peers))
        self._labelled = priorities

    def _retotal(self) -> None:
        heard = min((p.heard for p in self._peers.values()), default=math.inf)
        self._check_at = heard + self.options.peer_ttl  # when the longest-silent peer expires
        totals: dict[int, tuple[int, int]] = {}
        for peer in self._peers.values():
            for priority, (requests, size) in peer.bands.items():
                held = totals.get(priority, (0, 0))
                totals[priority] = (held[0] + requests, held[1] + size)
        self.bands = totals
        self.queued = sum(requests for requests, _ in totals.values())
        self.top = max((p for p, (r, _) in totals.items() if r), default=None)


def _parse(fact: Any) -> tuple[str, tuple[int, int], dict[int, tuple[int, int]]] | None:
    """A well-formed fact, or None (a malformed one is ignored)."""
    if not isinstance(fact, dict):
        return None
    src, v, bands = fact.get("src"), fact.get("v"), fact.get("bands")
    if not isinstance(src, str) or not isinstance(bands, dict) or len(bands) > MAX_BANDS:
        return None
    if not (isinstance(v, list) and len(v) == 2 and all(_count(x) for x in v)):
        return None
    parsed: dict[int, tuple[int, int]] = {}
    for key, pair in bands.items():
        try:
            priority = int(key)
        except (TypeError, ValueError):
            return None
        if not (isinstance(pair, list) and len(pair) == 2 and _count(pair[0]) and _count(pair[1])):
            return None
        parsed[priority] = (pair[0], pair[1])
    return src, (v[0], v[1]), parsed


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
