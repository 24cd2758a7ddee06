"""``data-parallel-profile-handler`` (deprecated upstream): one profile, the picked rank's address
in a header, the request sent to the pod's primary port.

For vLLM pods that run several data-parallel ranks behind one routing sidecar. Each rank is an
endpoint of its own (Kubernetes discovery: ``<namespace>/<pod>-rank-<i>`` on the pool's
``targetPorts[i]``, or ``--endpoint-target-ports``; file discovery: one entry per rank, named as
you like), so scorers see each rank's queue and cache. The request itself must reach the pod's
sidecar, which listens on the primary port and forwards to the rank named by the header.

- ``pick_profiles`` returns the configured profile while none has run, and nothing afterwards.
  The handler needs exactly one scheduling profile: with several (or none) it runs nothing, logs
  an error (rate-limited, at most once every 30 s) and the request fails with 429, as upstream.
- ``process_results`` sets the upstream request header ``x-data-parallel-host-port`` to
  ``<ip>:<port>`` of the profile's first target (the rank's own port, IPv6 bracketed), through
  ``InferenceRequest.upstream_headers`` (a value the client sent is removed by the server, so it
  cannot be forged). The result it returns holds a copy of every target with its port replaced by
  ``primaryPort`` (same endpoint id, name, rank, labels and metrics), so the destination Envoy
  receives is ``<ip>:<primaryPort>``; the scores stay keyed by endpoint id. A profile that produced
  no result fails the request with 429 ``ResourceExhausted`` (drop reason
  ``rejected-saturated``), like ``single-profile-handler``.

Parameters:

- ``primaryPort`` (int, default ``8000``): the sidecar's port. ``1..65535``; ``0`` is accepted
  because upstream accepts it (every request then goes to port 0, so a warning is logged at
  start); anything else is rejected at load.

The routing sidecar knows rank ``r`` by port ``primaryPort + r``, so list the pool's target ports
in rank order starting at the primary port (``targetPorts: [{number: 8000}, {number: 8001}]``).

YAML::

    plugins:
      - type: data-parallel-profile-handler
        parameters:
          primaryPort: 8000

Upstream deprecates this handler in favour of ``single-profile-handler`` with Istio >= 1.28.1;
loading it logs that, as upstream does.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Final

from epp.plugin import (
    CycleState,
    DropReason,
    ErrorCode,
    Handle,
    InferenceError,
    InferenceRequest,
    PluginBase,
    Profile,
    ProfileResult,
    SchedulingResult,
)
from epp.plugins.profiles.single import NO_ENDPOINTS_LEFT

DATA_PARALLEL_HEADER: Final = "x-data-parallel-host-port"
"""Upstream's ``DataParallelEndpointHeader``: the rank the sidecar forwards to."""
DEFAULT_PRIMARY_PORT: Final = 8000
_LOG_EVERY: Final = 30.0


class DataParallelProfileHandler(PluginBase):
    TYPE: ClassVar[str] = "data-parallel-profile-handler"

    @dataclass(frozen=True)
    class Params:
        primary_port: int = DEFAULT_PRIMARY_PORT

        def __post_init__(self) -> None:
            if self.primary_port != 0 and not 1 <= self.primary_port <= 65535:
                raise ValueError(
                    f"invalid primaryPort: must be between 1 and 65535, got {self.primary_port}"
                )

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._log = handle.logger(self.typed_name)
        self._logged_at = -_LOG_EVERY
        self._log.warning("Deprecated: Use simple-profile-handler with Istio >= 1.28.1")
        if params.primary_port == 0:
            self._log.warning("primaryPort is 0: every request is sent to port 0")

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Profile],
        results: Mapping[str, ProfileResult | None],
    ) -> Mapping[str, Profile]:
        if len(profiles) == len(results):  # every profile ran already
            return {}
        if len(profiles) != 1:
            now = time.monotonic()
            if now - self._logged_at >= _LOG_EVERY:
                self._logged_at = now
                self._log.error(
                    "Data Parallel profile handler requires exactly one scheduling profile, got %d",
                    len(profiles),
                )
            return {}
        return dict(profiles)

    def process_results(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileResult | None],
    ) -> SchedulingResult:
        if len(results) != 1:
            raise InferenceError(
                ErrorCode.RESOURCE_EXHAUSTED,
                "failed to find target endpoint: data parallel profile handler is intended to be "
                "used with a single profile, failed to process multiple profiles",
            )
        ((name, result),) = results.items()
        if result is None or not result.targets:
            raise InferenceError(
                ErrorCode.RESOURCE_EXHAUSTED, NO_ENDPOINTS_LEFT, drop_reason=DropReason.SATURATED
            )
        request.upstream_headers[DATA_PARALLEL_HEADER] = result.targets[0].hostport
        port = self.params.primary_port
        targets = tuple(dataclasses.replace(ep, port=port) for ep in result.targets)
        rewritten = ProfileResult(targets=targets, scores=result.scores)
        return SchedulingResult(profile_results={name: rewritten}, primary_profile=name)
