"""Data exchanged between in-flight-load plugins.

``inflight-load-producer`` publishes ``InFlightLoad/<name>`` (``INFLIGHT_LOAD.key(name)``): a
``Mapping[endpoint id, InFlightLoad]`` covering every candidate endpoint.
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
