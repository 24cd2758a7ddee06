"""``single-profile-handler``: run the one configured scheduling profile once; it is primary.

The config loader adds this handler when a config has exactly one profile and no handler.

- ``pick_profiles`` returns every profile (there is one) while no profile has run yet, and nothing
  afterwards, which ends the scheduling loop.
- ``process_results`` makes that profile's result the primary one. A profile that produced no
  result (its filters left no endpoint) fails the request with 429 ``ResourceExhausted`` and drop
  reason ``rejected-saturated``.

Parameters: none.

YAML::

    plugins:
      - type: single-profile-handler
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from epp.plugin import (
    CycleState,
    DropReason,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    PluginBase,
    Profile,
    ProfileResult,
    SchedulingResult,
)

NO_ENDPOINTS_LEFT = "failed to find target endpoint: no endpoints left after filters"


class SingleProfileHandler(PluginBase):
    TYPE: ClassVar[str] = "single-profile-handler"

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Profile],
        results: Mapping[str, ProfileResult | None],
    ) -> Mapping[str, Profile]:
        if results:
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
                "failed to find target endpoint: single profile handler expects exactly one "
                f"profile result, got {len(results)}",
            )
        ((name, result),) = results.items()
        if result is None:
            raise InferenceError(
                ErrorCode.RESOURCE_EXHAUSTED, NO_ENDPOINTS_LEFT, drop_reason=DropReason.SATURATED
            )
        return SchedulingResult(profile_results={name: result}, primary_profile=name)
