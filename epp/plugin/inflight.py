"""Data exchanged between in-flight-load plugins.

``inflight-load-producer`` publishes ``InFlightLoad/<name>`` (``data_key(INFLIGHT_LOAD, name)``):
a ``Mapping[endpoint id, InFlightLoad]`` covering every candidate endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

INFLIGHT_LOAD: Final = "InFlightLoad"


@dataclass(frozen=True, slots=True)
class InFlightLoad:
    """Requests this EPP dispatched to an endpoint that have not completed, and their uncached
    prompt tokens still being prefilled."""

    requests: int
    tokens: int
