"""Data exchanged between in-flight-load plugins.

``inflight-load-producer`` publishes, for every candidate endpoint:

- ``InFlightLoad/<name>`` (``INFLIGHT_LOAD.key(name)``): a ``Mapping[endpoint id, InFlightLoad]``,
  what the EPP has in flight there: this replica's own requests plus, when replicas share state
  (``epp.plugin.SharedState``), those the other replicas last reported (upstream's data type);
- ``LoadEstimate/<name>`` (``LOAD_ESTIMATE.key(name)``): a ``Mapping[endpoint id, float]``, the
  requests waiting or running there from every client, estimated from the last scrape and the
  replicas' dispatches and completions since (this EPP's own data type, see ``LOAD_ESTIMATE``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from epp.plugin.keys import DataType


@dataclass(frozen=True, slots=True)
class InFlightLoad:
    """Requests the EPP dispatched to an endpoint that have not completed, and their uncached
    prompt tokens still being prefilled: this replica's, plus its peers' as last reported when
    replicas share state (each peer's count is up to one sync interval old)."""

    requests: int
    tokens: int


INFLIGHT_LOAD: Final[DataType[Mapping[str, InFlightLoad]]] = DataType("InFlightLoad")
"""Data type of a ``Mapping[str, InFlightLoad]`` (endpoint id → load)."""

LOAD_ESTIMATE: Final[DataType[Mapping[str, float]]] = DataType("LoadEstimate")
"""Data type of a ``Mapping[str, float]``: endpoint id → estimated requests waiting or running
on the endpoint right now, whoever sent them (a whole number today; ``float`` leaves room for
weighted estimates). With ``t`` the endpoint's last scrape (``Metrics.update_time``, this
replica's clock)::

    estimate = max(own, max(0, waiting + running - completed + peers_delta) + dispatched)

    waiting + running   scraped at t (Metrics.waiting_queue_size + running_requests_size)
    dispatched          this replica's requests sent there after t and still in flight
    completed           this replica's requests sent there at or before t that completed after t
    own                 all this replica's requests in flight there (a floor: the server holds
                        them even when a scrape missed one still in transit)
    peers_delta         the other replicas' in-flight requests there as known now, minus as
                        known here at t (0 without peers); negative when they completed more
                        than they dispatched since

The scrape is the truth (it sees every replica, restarts and foreign clients); this replica's
own dispatches and completions since then are the part of the truth the scrape cannot have seen
yet, known exactly. ``peers_delta`` is the same correction for the other replicas, as well as it
can be known: a peer's change is dated when this replica hears of it, one sync interval plus
transport after it happened. So a peer's dispatch is missing until heard of (as it is without
sharing), and one the scrape at ``t`` already saw but heard of only after ``t`` counts twice
until the next scrape (at most one scrape interval). An endpoint without metrics, or whose
metrics are older than the producer's staleness bound, is estimated at ``own`` plus the peers'
reported in-flight requests. Producers may publish it lazily (computed when first read); a
consumer reads it like any mapping."""
