"""``header-profile-handler`` (alpha): run the one scheduling profile a request header names.

One EPP serves several stages of a disaggregated pipeline (``encode``, ``prefill``,
``decode``) for a caller that already knows which stage each call is for (llm-d's coordinator
sends ``EPP-Profile: prefill``, then ``EPP-Profile: decode``...), instead of one EPP per stage.
Exactly one profile runs per request, and it is primary:

- with a single configured profile, that profile, whatever the header says (nothing to choose);
- else the profile named by the header's value (trimmed, matched case-sensitively against
  ``schedulingProfiles[].name``);
- else, when the header is missing or blank, ``defaultProfile``;
- a value naming no configured profile (or a ``defaultProfile`` that is not configured) runs no
  profile: the request gets upstream's 429 ``failed to find target endpoint: no profile ran``,
  and the reason (missing header or unknown value, with the configured names) is logged at INFO,
  at most once every ``LOG_EVERY_S`` seconds per reason with the count in between.

A profile whose filters leave no endpoint fails the request with 429 ``rejected-saturated``, as
``single-profile-handler``. Unlike ``disagg-profile-handler`` it sets no headers (no PreRequest):
the caller tracks the stages itself.

Parameters:

- ``headerName`` (``EPP-Profile``): the request header naming the profile; header names are
  matched case-insensitively (the EPP lowercases them);
- ``defaultProfile`` (``decode``): the profile run when the header is missing or blank and more
  than one profile is configured.

YAML::

    plugins:
      - type: encode-filter
      - type: prefill-filter
      - type: decode-filter
      - type: header-profile-handler
        parameters: {headerName: EPP-Profile, defaultProfile: decode}
    schedulingProfiles:
      - {name: encode, plugins: [{pluginRef: encode-filter}]}
      - {name: prefill, plugins: [{pluginRef: prefill-filter}]}
      - {name: decode, plugins: [{pluginRef: decode-filter}]}
"""

from __future__ import annotations

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
    Stability,
)

DEFAULT_HEADER: Final = "EPP-Profile"
DEFAULT_PROFILE: Final = "decode"
LOG_EVERY_S: Final = 30.0
MAX_LOGGED_CHARS: Final = 128
NO_ENDPOINTS_LEFT: Final = "failed to find target endpoint: no endpoints left after filters"


class HeaderProfileHandler(PluginBase):
    TYPE: ClassVar[str] = "header-profile-handler"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    @dataclass(frozen=True)
    class Params:
        header_name: str = DEFAULT_HEADER
        default_profile: str = DEFAULT_PROFILE

    params: Params

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self.header = params.header_name.strip().lower() or DEFAULT_HEADER.lower()
        self.default_profile = params.default_profile.strip() or DEFAULT_PROFILE
        self._log = handle.logger(self.typed_name)
        self._logged: dict[str, tuple[float, int]] = {}  # reason → (last logged, suppressed)

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Profile],
        results: Mapping[str, ProfileResult | None],
    ) -> Mapping[str, Profile]:
        if results:  # the one profile ran
            return {}
        if len(profiles) == 1:
            return dict(profiles)
        named = request.headers.get(self.header, "").strip()
        wanted = named or self.default_profile
        profile = profiles.get(wanted)
        if profile is None:
            self._no_profile(cycle.now, named, profiles)
            return {}
        return {wanted: profile}

    def process_results(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileResult | None],
    ) -> SchedulingResult:
        if len(results) != 1:
            raise InferenceError(
                ErrorCode.RESOURCE_EXHAUSTED,
                "failed to find target endpoint: header profile handler runs one profile per "
                f"request, got {len(results)}",
            )
        ((name, result),) = results.items()
        if result is None:
            raise InferenceError(
                ErrorCode.RESOURCE_EXHAUSTED, NO_ENDPOINTS_LEFT, drop_reason=DropReason.SATURATED
            )
        return SchedulingResult(profile_results={name: result}, primary_profile=name)

    def _no_profile(self, now: float, named: str, profiles: Mapping[str, Profile]) -> None:
        """Log why no profile runs (rate-limited per reason; the values are client-chosen)."""
        reason = "unknown" if named else "default"
        last, suppressed = self._logged.get(reason, (-LOG_EVERY_S, 0))
        if now - last < LOG_EVERY_S:
            self._logged[reason] = (last, suppressed + 1)
            return
        self._logged[reason] = (now, 0)
        if named:
            value = named[:MAX_LOGGED_CHARS]
            why = f"no scheduling profile configured for {self.header!r} header value {value!r}"
        else:
            why = f"{self.header!r} header missing and defaultProfile {self.default_profile!r} "
            why += "is not a configured scheduling profile"
        self._log.info(
            "no scheduling profile selected for request: %s (configured: %s)%s",
            why,
            ", ".join(sorted(profiles)),
            f" ({suppressed} more since the last report)" if suppressed else "",
        )
