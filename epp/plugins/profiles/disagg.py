"""``disagg-profile-handler``: disaggregated serving, decode always, prefill and encode on demand.

Each request runs up to three scheduling profiles and decode's pick is the one Envoy routes to:

- ``decode-first`` (default): run ``decode``. If it picked nothing, stop (the request fails with
  429 ``failed to find available decode workers``). Then, when an ``encode`` profile exists and
  ``deciders.encode`` approves (given the decode pick), run ``encode``; then, when a ``prefill``
  profile exists and ``deciders.prefill`` approves, publish the decode pick as the request
  attribute ``peer-endpoint/disagg-profile-handler`` and run ``prefill``.
- ``prefill-first``: run ``prefill`` whenever that profile exists (a prefill decider is refused
  at startup), then ``encode`` when its decider approves (given no endpoint), then publish the
  prefill pick as ``peer-endpoint`` and run ``decode``.

A stage without a decider never runs. Each decider is asked at most once per request; one that
raises counts as "no" and is logged (rate-limited). When all stages are done the decision is
counted in ``llm_d_epp_disagg_decision_total{plugin_name, plugin_type, model_name,
decision_type}`` (``decode-only``, ``prefill-decode``, ``encode-decode``,
``encode-prefill-decode``; a stage counts when it picked an endpoint; an empty model reads
``unknown``) and its deprecated twin ``llm_d_inference_scheduler_disagg_decision_total{model_name,
decision_type}``. Unlike upstream, ``model_name`` takes at most 1000 distinct values per handler
(clients choose model names); later ones read ``other``. On a traced request each pick records
upstream's ``pick_disagg_profile`` span (``pick_pd_profile`` for ``pd-profile-handler``) with
``llm_d.epp.profile_handler.decision`` and the request's ``gen_ai.*`` and ``mm.*`` attributes.

The scheduling result holds decode (primary) and the prefill and encode results that exist. As a
PreRequest plugin the handler then sets, on the request the decode pod receives,
``x-prefiller-host-port: <ip:port>`` (the prefill pick) and ``x-encoder-hosts-ports:
<ip:port,...>`` (every encode pick); a header whose stage did not run is not sent, and a value the
client sent for either is removed. The handler consumes ``TokenizedPrompt/token-producer`` and
``PrefixCacheMatchInfo/approx-prefix-cache-producer`` (for its prefill decider), so the loader
creates those producers when the config declares none, as upstream.

Parameters:

- ``profiles.decode`` / ``profiles.prefill`` / ``profiles.encode`` (default ``decode`` /
  ``prefill`` / ``encode``): profile names.
- ``deciders.prefill`` / ``deciders.encode`` (plugin names, default unset = stage disabled): see
  ``epp.plugins.profiles.deciders``.
- ``stageOrder`` (``decode-first`` | ``prefill-first``, default ``decode-first``; case, ``-`` and
  ``_`` are ignored, ``decode`` and ``prefill`` also work).
- Deprecated flat format (logged; never mixed with the nested one): ``decodeProfile``,
  ``prefillProfile``, ``encodeProfile``, ``prefillDeciderPluginName``, ``encodeDeciderPluginName``
  and ``deciderPluginName`` (alias of ``prefillDeciderPluginName``, which wins).

A decider may be declared before or after the handler. Upstream resolves it when the handler is
built; here a name not resolvable then is resolved when the EPP starts, which fails with
``plugin '<handler>' ...: parameters.deciders.prefill: plugin not found: <name>`` (or "is not a
decider"); a request scheduled before that point resolves it itself and fails with a 500 that
says the same.

YAML::

    plugins:
      - type: prefix-based-pd-decider
        parameters: {nonCachedTokens: 256}
      - type: disagg-profile-handler
        parameters:
          deciders: {prefill: prefix-based-pd-decider}
    schedulingProfiles:
      - name: prefill
        plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}]
      - name: decode
        plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]

``pd-profile-handler`` (deprecated since upstream v0.7; use ``disagg-profile-handler``): the
older P/D-only handler, kept as upstream has it. It runs ``decodeProfile`` (default ``decode``),
then asks ``deciderPluginName`` (default ``prefix-based-pd-decider``; required, resolved like the
deciders above) with the decode pick and runs ``prefillProfile`` (default ``prefill``) when it
approves. Its decisions are counted in ``llm_d_epp_pd_decision_total`` (``prefill-decode`` |
``decode-only``, labels as above) and ``llm_d_inference_scheduler_pd_decision_total``. It is no
PreRequest plugin: pair it with ``prefill-header-handler`` for ``x-prefiller-host-port``, and it
publishes no ``peer-endpoint``. ``primaryPort`` (1-65535; deprecated, logged) sets
``x-data-parallel-host-port: <decode ip:port>`` and rewrites the decode targets' port to it.
``prefixMatchInfoProducerName`` names the prefix producer it declares it consumes (default
``approx-prefix-cache-producer``); ``prefixPluginType`` and ``prefixPluginName`` are accepted and
ignored, as upstream. Its deprecation is logged when it is built.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from prometheus_client import Counter

from epp.plugin import (
    PREFIX_MATCH_INFO,
    CycleState,
    DataKey,
    DropReason,
    Endpoint,
    ErrorCode,
    Handle,
    InferenceError,
    InferenceRequest,
    PluginBase,
    Profile,
    ProfileResult,
    SchedulingResult,
    TypedName,
)
from epp.plugin.metrics import metric_family
from epp.plugin.roles import PEER_ENDPOINT, write_disagg_headers
from epp.plugin.spans import request_span_attributes, request_spans
from epp.plugins.profiles.deciders import PREFIX_KEY, TOKENS_KEY, DeciderRef, RateLimitedLog, ask
from epp.plugins.profiles.disagg_params import PREFILL_FIRST, DisaggParams

DECISION_ATTRIBUTE: Final = "llm_d.epp.profile_handler.decision"

DATA_PARALLEL_HEADER: Final = "x-data-parallel-host-port"
NO_DECODE = "failed to find target endpoint: failed to find available decode workers"

Results = Mapping[str, ProfileResult | None]


DECODE_ONLY: Final = "decode-only"
PREFILL_DECODE: Final = "prefill-decode"
ENCODE_DECODE: Final = "encode-decode"
ENCODE_PREFILL_DECODE: Final = "encode-prefill-decode"

MODEL_LABEL_CAP: Final = 1000
"""Distinct ``model_name`` values a decision family labels before folding the rest into
``other`` (model names come from clients)."""
MAX_MODEL_LABEL_CHARS: Final = 256
"""A longer model name reads ``other`` (so 1000 labels stay a few hundred KB of ``/metrics``)."""


def decision_type(encode_used: bool, prefill_used: bool) -> str:
    """Upstream's ``DisaggDecisionType``."""
    if encode_used and prefill_used:
        return ENCODE_PREFILL_DECODE
    if encode_used:
        return ENCODE_DECODE
    return PREFILL_DECODE if prefill_used else DECODE_ONLY


class DecisionCounter:
    """``llm_d_epp_<kind>_decision_total{plugin_name, plugin_type, model_name, decision_type}``
    and its deprecated twin ``llm_d_inference_scheduler_<kind>_decision_total{model_name,
    decision_type}``; ``kind`` is ``disagg`` or ``pd``. An empty model name reads ``unknown``."""

    def __init__(self, handle: Handle, typed_name: TypedName, kind: str, doc: str) -> None:
        self._typed_name = typed_name
        self._current = metric_family(
            handle.registry,
            Counter,
            f"llm_d_epp_{kind}_decision_total",
            doc,
            ("plugin_name", "plugin_type", "model_name", "decision_type"),
        )
        self._twin = metric_family(
            handle.registry,
            Counter,
            f"llm_d_inference_scheduler_{kind}_decision_total",
            f"[Deprecated: Use llm_d_epp_{kind}_decision_total] {doc}",
            ("model_name", "decision_type"),
        )
        self._models: set[str] = set()

    def record(self, model: str, decision: str) -> None:
        model = self._label(model or "unknown")
        name = self._typed_name
        self._current.labels(name.name, name.type, model, decision).inc()
        self._twin.labels(model, decision).inc()

    def _label(self, model: str) -> str:
        if model in self._models:
            return model
        if len(self._models) >= MODEL_LABEL_CAP or len(model) > MAX_MODEL_LABEL_CHARS:
            return "other"
        self._models.add(model)
        return model


def no_decode_error() -> InferenceError:
    return InferenceError(ErrorCode.RESOURCE_EXHAUSTED, NO_DECODE, drop_reason=DropReason.SATURATED)


class DisaggProfileHandler(PluginBase):
    TYPE: ClassVar[str] = "disagg-profile-handler"
    Params: ClassVar[type[Any]] = DisaggParams

    params: DisaggParams

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        log = handle.logger(self.typed_name)
        self.params.log_deprecations(log)
        eff = self.params.effective()
        self.stage_order = eff.stage_order
        self.decode_profile = eff.decode_profile
        self.prefill_profile = eff.prefill_profile
        self.encode_profile = eff.encode_profile
        self._prefill_decider = DeciderRef(
            handle, self.typed_name, "deciders.prefill", eff.prefill_decider
        )
        self._encode_decider = DeciderRef(
            handle, self.typed_name, "deciders.encode", eff.encode_decider
        )
        for ref, stage in ((self._prefill_decider, "P/D"), (self._encode_decider, "E")):
            if not ref.name:
                log.info("No %s configured, %s disaggregation disabled", ref.field, stage)
        self._decisions = DecisionCounter(
            handle,
            self.typed_name,
            "disagg",
            "Total number of disaggregation routing decisions made",
        )
        self._errors = RateLimitedLog(log, handle.clock)
        self._asked = f"{self.typed_name}/asked"  # cycle.data: stages whose decider said no

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({PREFIX_KEY, TOKENS_KEY})

    async def start(self) -> None:
        """Resolve the deciders once every plugin exists; a bad name stops the EPP here."""
        self._prefill_decider.resolve()
        self._encode_decider.resolve()

    async def stop(self) -> None:
        return None

    # ---- ProfileHandler -----------------------------------------------------------------------

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Profile],
        results: Results,
    ) -> Mapping[str, Profile]:
        spans = request_spans(request)
        start = time.time_ns() if spans is not None else 0
        if self.stage_order == PREFILL_FIRST:
            chosen = self._pick_prefill_first(cycle, request, profiles, results)
        else:
            chosen = self._pick_decode_first(cycle, request, profiles, results)
        if spans is not None:
            attributes = request_span_attributes(request)
            attributes.update(self._decision(profiles, results, chosen))
            spans.add_span("pick_disagg_profile", start, time.time_ns(), attributes)
        return chosen

    def _decision(
        self, profiles: Mapping[str, Profile], results: Results, chosen: Mapping[str, Profile]
    ) -> dict[str, Any]:
        """Upstream's ``llm_d.epp.profile_handler.*`` attributes of one pick."""
        for stage, name in (
            ("decode", self.decode_profile),
            ("encode", self.encode_profile),
            ("prefill", self.prefill_profile),
        ):
            if name in chosen:
                return {DECISION_ATTRIBUTE: f"run_{stage}"}
        if self.decode_profile not in profiles:
            return {DECISION_ATTRIBUTE: "error_missing_decode_profile"}
        decode = results.get(self.decode_profile)
        failed = self.decode_profile in results and (decode is None or not decode.targets)
        return {DECISION_ATTRIBUTE: "complete", "llm_d.epp.profile_handler.decode_failed": failed}

    def _pick_decode_first(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Profile],
        results: Results,
    ) -> Mapping[str, Profile]:
        if self.decode_profile not in results:
            return self._decode_stage(profiles)
        decode = results[self.decode_profile]
        if decode is None or not decode.targets:
            return {}
        pick = decode.targets[0]
        encode = self._optional_stage(cycle, request, profiles, results, "encode", pick)
        if encode:
            return encode
        prefill = self._optional_stage(cycle, request, profiles, results, "prefill", pick)
        if prefill:
            request.attributes[PEER_ENDPOINT] = pick
            return prefill
        self._record(request, results)
        return {}

    def _pick_prefill_first(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Profile],
        results: Results,
    ) -> Mapping[str, Profile]:
        if self.decode_profile in results:
            decode = results[self.decode_profile]
            if decode is not None and decode.targets:
                self._record(request, results)
            return {}
        if self.prefill_profile in profiles and self.prefill_profile not in results:
            return {self.prefill_profile: profiles[self.prefill_profile]}
        encode = self._optional_stage(cycle, request, profiles, results, "encode", None)
        if encode:
            return encode
        prefill = results.get(self.prefill_profile)
        if prefill is not None and prefill.targets:
            request.attributes[PEER_ENDPOINT] = prefill.targets[0]
        return self._decode_stage(profiles)

    def _decode_stage(self, profiles: Mapping[str, Profile]) -> Mapping[str, Profile]:
        profile = profiles.get(self.decode_profile)
        if profile is None:
            self._errors(logging.ERROR, "decode profile %r is not configured", self.decode_profile)
            return {}
        return {self.decode_profile: profile}

    def _optional_stage(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Profile],
        results: Results,
        stage: str,
        pick: Endpoint | None,
    ) -> Mapping[str, Profile]:
        """The ``stage`` profile when it exists, has not run, and its decider approves now."""
        name, ref = (
            (self.encode_profile, self._encode_decider)
            if stage == "encode"
            else (self.prefill_profile, self._prefill_decider)
        )
        asked: set[str] = cycle.data.setdefault(self._asked, set())
        if name not in profiles or name in results or name in asked:
            return {}
        asked.add(name)
        if ask(ref.get(), cycle, request, pick, self._errors):
            return {name: profiles[name]}
        return {}

    def _record(self, request: InferenceRequest, results: Results) -> None:
        encode, prefill = results.get(self.encode_profile), results.get(self.prefill_profile)
        used = decision_type(bool(encode and encode.targets), bool(prefill and prefill.targets))
        self._decisions.record(request.target_model, used)

    def process_results(
        self, cycle: CycleState, request: InferenceRequest, results: Results
    ) -> SchedulingResult:
        decode = results.get(self.decode_profile)
        if decode is None or not decode.targets:
            raise no_decode_error()
        out: dict[str, ProfileResult] = {self.decode_profile: decode}
        for name in (self.prefill_profile, self.encode_profile):
            result = results.get(name)
            if result is not None:
                out[name] = result
        return SchedulingResult(profile_results=out, primary_profile=self.decode_profile)

    # ---- PreRequest ---------------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        write_disagg_headers(
            request,
            result,
            prefill_profile=self.prefill_profile,
            encode_profile=self.encode_profile,
        )


# ---- pd-profile-handler (deprecated) ----------------------------------------------------------


class PdProfileHandler(PluginBase):
    TYPE: ClassVar[str] = "pd-profile-handler"

    @dataclass(frozen=True)
    class Params:
        decode_profile: str = "decode"
        prefill_profile: str = "prefill"
        prefix_plugin_type: str = ""
        """Deprecated: never used."""
        prefix_plugin_name: str = ""
        """Deprecated: never used."""
        primary_port: int = 0
        decider_plugin_name: str = "prefix-based-pd-decider"
        prefix_match_info_producer_name: str = ""

        def __post_init__(self) -> None:
            if self.primary_port != 0 and not 1 <= self.primary_port <= 65535:
                raise ValueError(
                    f"invalid primaryPort: must be between 1 and 65535, got {self.primary_port}"
                )
            if not self.decider_plugin_name:
                raise ValueError("decider plugin name is not defined")
            if not self.decode_profile or not self.prefill_profile:
                raise ValueError("decodeProfile and prefillProfile must not be empty")

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        log = handle.logger(self.typed_name)
        log.info("Deprecated: pd-profile-handler is deprecated, use disagg-profile-handler instead")
        if self.params.primary_port:
            log.info("Deprecated: primaryPort not needed with Istio >= 1.28.1")
        self._decider = DeciderRef(
            handle, self.typed_name, "deciderPluginName", self.params.decider_plugin_name
        )
        producer = self.params.prefix_match_info_producer_name or PREFIX_KEY.producer
        self._prefix_key = PREFIX_MATCH_INFO.key(producer)
        self._decisions = DecisionCounter(
            handle, self.typed_name, "pd", "Total number of P/D disaggregation decisions made"
        )
        self._errors = RateLimitedLog(log, handle.clock)

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._prefix_key, TOKENS_KEY})

    async def start(self) -> None:
        self._decider.resolve()

    async def stop(self) -> None:
        return None

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Profile],
        results: Results,
    ) -> Mapping[str, Profile]:
        spans = request_spans(request)
        start = time.time_ns() if spans is not None else 0
        chosen, decision = self._pick(cycle, request, profiles, results)
        if spans is not None:
            attributes = request_span_attributes(request)
            attributes["llm_d.epp.profile_handler.total_profiles"] = len(profiles)
            attributes["llm_d.epp.profile_handler.executed_profiles"] = len(results)
            attributes[DECISION_ATTRIBUTE] = decision
            if chosen:
                attributes["llm_d.epp.profile_handler.selected_profile"] = next(iter(chosen))
            if decision == "complete":
                decode = results.get(self.params.decode_profile)
                attributes["llm_d.epp.profile_handler.decode_failed"] = decode is None
            spans.add_span("pick_pd_profile", start, time.time_ns(), attributes)
        return chosen

    def _pick(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Profile],
        results: Results,
    ) -> tuple[Mapping[str, Profile], str]:
        """The profiles to run next and upstream's name of the decision."""
        decode_name, prefill_name = self.params.decode_profile, self.params.prefill_profile
        if decode_name not in results:
            decode_profile = profiles.get(decode_name)
            chosen = {decode_name: decode_profile} if decode_profile is not None else {}
            return chosen, "run_decode"
        decode = results[decode_name]
        if decode is None or not decode.targets or prefill_name in results:
            return {}, "complete"
        if len(profiles) == len(results):  # as upstream: every configured profile ran
            return {}, "complete"
        decider = self._decider.get()
        prefill = profiles.get(prefill_name)
        approved = ask(decider, cycle, request, decode.targets[0], self._errors)
        if prefill is not None and approved:
            self._decisions.record(request.target_model, "prefill-decode")
            return {prefill_name: prefill}, "prefill_decode"
        self._decisions.record(request.target_model, "decode-only")
        return {}, "decode_only"

    def process_results(
        self, cycle: CycleState, request: InferenceRequest, results: Results
    ) -> SchedulingResult:
        decode_name = self.params.decode_profile
        decode = results.get(decode_name)
        if decode is None or not decode.targets:
            raise no_decode_error()
        port = self.params.primary_port
        if port:
            request.upstream_headers[DATA_PARALLEL_HEADER] = decode.targets[0].hostport
            decode = ProfileResult(
                targets=tuple(dataclasses.replace(ep, port=port) for ep in decode.targets),
                scores=decode.scores,
            )
        out: dict[str, ProfileResult] = {decode_name: decode}
        prefill = results.get(self.params.prefill_profile)
        if prefill is not None:
            out[self.params.prefill_profile] = prefill
        return SchedulingResult(profile_results=out, primary_profile=decode_name)
