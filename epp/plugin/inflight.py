"""Data exchanged between in-flight-load plugins.

``inflight-load-producer`` publishes, for every candidate endpoint:

- ``InFlightLoad/<name>`` (``INFLIGHT_LOAD.key(name)``): a ``Mapping[endpoint id, InFlightLoad]``,
  what this EPP itself has in flight there (upstream's data type);
- ``LoadEstimate/<name>`` (``LOAD_ESTIMATE.key(name)``): a ``Mapping[endpoint id, float]``, the
  requests waiting or running there from every client, estimated from the last scrape and this
  EPP's own dispatches and completions since (this EPP's own data type, see ``LOAD_ESTIMATE``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from epp.plugin.keys import DataType


@dataclass(frozen=True, slots=True)
class InFlightLoad:
    """Requests this EPP dispatched to an endpoint that have not completed, and their uncached
    prompt tokens still being prefilled."""

    requests: int
    tokens: int


INFLIGHT_LOAD: Final[DataType[Mapping[str, InFlightLoad]]] = DataType("InFlightLoad")
"""Data type of a ``Mapping[str, InFlightLoad]`` (endpoint id → load)."""

LOAD_ESTIMATE: Final[DataType[Mapping[str, float]]] = DataType("LoadEstimate")
"""Data type of a ``Mapping[str, float]``: endpoint id → estimated requests waiting or running
on the endpoint right now, whoever sent them (a whole number today; ``float`` leaves room for
weighted estimates). With ``t`` the endpoint's last scrape (``Metrics.update_time``)::

    estimate = max(own, max(0, waiting + running - completed) + dispatched)

    waiting + running   scraped at t (Metrics.waiting_queue_size + running_requests_size)
    dispatched          this EPP's requests sent there after t and still in flight
    completed           this EPP's requests sent there at or before t that completed after t
    own                 all this EPP's requests in flight there (a floor: the server holds them
                        even when a scrape missed one still in transit)

The scrape is the truth (it sees other EPP replicas, restarts and foreign clients); this EPP's
own dispatches and completions since then are the part of the truth the scrape cannot have seen
yet. An endpoint without metrics, or whose metrics are older than the producer's staleness bound,
is estimated at ``own`` alone. Producers may publish it lazily (computed when first read); a
consumer reads it like any mapping."""
