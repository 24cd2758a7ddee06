"""``disaggregatedset-rollout-screener`` (alpha): during a DisaggregatedSet rollout, a request's
prefill and decode pods always come from the same revision.

A DisaggregatedSet revision is one version of the whole disaggregated deployment: every prefill
and decode pod created for it carries the same ``disaggregatedset.x-k8s.io/revision`` label. Pods
of two revisions may not exchange KV cache (another KV layout, transfer protocol, engine or
driver), so the screener runs before every scheduling profile (a ``Screener``) and leaves the
profiles only the pods of one revision: no later filter, scorer or picker can pair across.

**Revision gating** (``revisionGating.mode`` ``sum`` or ``max-role``). The screener hears the
pool's endpoints join, change and leave (an ``EndpointExtractor``; listed under no source it is
attached to an ``endpoint-notification-source`` on its own) and counts the pods matching
``scope.labelSelector`` per revision (``revisionLabelKey``) and role (``roleLabelKey``). Per
request, with no strict header (below):

1. it drops the candidates of every revision that is not *covered* (a role of
   ``requireRoles.values`` has no pod in it) or has no label;
2. it draws one of the remaining revisions, weighted by its share (``cycle.rng``), and keeps only
   that revision's candidates, for every profile of the request.

Shares (``epp.plugins.screeners.revisions``): ``sum`` weighs a revision by its pods over the
required roles; ``max-role`` by its pods of the role with the most pods over all covered
revisions. Rolling 2 prefill and 10 decode pods from A to B, at prefill ``A=2, B=1`` and decode
``A=9, B=1``: ``max-role`` sends 90% of requests to A and 10% to B, ``sum`` 11/13 and 2/13. With
no covered revision among the candidates (before the first endpoints arrive, or mid-rollout with
no revision complete) the request gets 503: the screener never routes without cross-role
coverage. The share of each revision is the gauge
``llm_d_epp_disaggregatedset_revision_gating_share{plugin_type, plugin_name, mode, revision}``
(0 for a revision seen but not covered; the series goes when the revision's last pod does).

**Header selectors** (``headerSelectors``). Each maps a request and response header to an
endpoint label. A ``strict`` selector whose header a request carries keeps only the candidates
whose label equals it (and then no revision is drawn: the header already chose); none matching
fails the request with 503 and counts
``llm_d_epp_disaggregatedset_strict_header_no_match_total{plugin_type, plugin_name, selector}``.
A ``prefer`` selector screens nothing (a ``header-label-affinity-scorer`` with the same header
and label expresses the preference). Every selector stamps its header on the response with the
label of the endpoint that served the request (the served endpoint Envoy reports, else the
primary profile's first target), so a coordinator can pass the prefill's revision and slice to
a later decode request.

``revisionGating.mode: disabled`` keeps the header selectors and the stamping but neither checks
coverage nor draws a revision.

Parameters (upstream's):

* ``scope.labelSelector`` (required): the pods counted, a Kubernetes label selector string;
* ``headerSelectors`` (default none): ``{name, headerName, labelKey, mode: strict|prefer}``;
  ``name`` labels the no-match counter; names and header names are unique;
* ``revisionGating`` (required): ``mode`` (``sum``, ``max-role`` or ``disabled``),
  ``requireRoles.values`` (required unless disabled), ``revisionLabelKey`` (default
  ``disaggregatedset.x-k8s.io/revision``), ``roleLabelKey`` (default
  ``disaggregatedset.x-k8s.io/role``).

YAML (declare it among ``plugins``, not in a profile; it runs once per request)::

    plugins:
    - type: disaggregatedset-rollout-screener
      name: rollout-screener
      parameters:
        scope:
          labelSelector: "disaggregatedset.x-k8s.io/name=my-set"
        headerSelectors:
        - {name: revision, headerName: x-disagg-revision,
           labelKey: disaggregatedset.x-k8s.io/revision, mode: strict}
        - {name: slice, headerName: x-disagg-slice,
           labelKey: disaggregatedset.x-k8s.io/slice, mode: prefer}
        revisionGating:
          mode: max-role
          requireRoles: {values: [prefill, decode]}

Differences from upstream: upstream counts the Ready pods of a Pod watch of its own; this screener
counts the pool's endpoints (in Kubernetes mode the Ready pods the pool selects, with file
discovery the file's entries), so the roles it requires must be in this EPP's pool. With one EPP
for prefill and decode (the topology upstream supports end to end) the two are the same. A pod
with several data-parallel ranks counts once, as upstream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

from prometheus_client import Counter, Gauge

from epp.plugin import (
    CycleState,
    Endpoint,
    EndpointEvent,
    EndpointEventType,
    Handle,
    InferenceRequest,
    PluginBase,
    ResponseInfo,
    SchedulingResult,
    Stability,
)
from epp.plugin.metrics import metric_family
from epp.plugin.selectors import parse_selector
from epp.plugins.screeners.disaggregatedset_params import STRICT, RevisionGating, RolloutParams
from epp.plugins.screeners.revisions import (
    Distribution,
    PodRevisions,
    distribution,
    pick_revision,
    pod_key,
)

SHARE_METRIC: Final = "llm_d_epp_disaggregatedset_revision_gating_share"
NO_MATCH_METRIC: Final = "llm_d_epp_disaggregatedset_strict_header_no_match"


class DisaggregatedSetRolloutScreener(PluginBase):
    """Revision gating, strict header selectors and response-header stamping."""

    TYPE: ClassVar[str] = "disaggregatedset-rollout-screener"
    STABILITY: ClassVar[Stability] = Stability.ALPHA
    Params: ClassVar[type[Any]] = RolloutParams

    params: RolloutParams

    def __init__(self, *, name: str, params: RolloutParams, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        gating = params.revision_gating
        assert gating is not None  # Params requires it
        self._gating: RevisionGating = gating
        self._scope = parse_selector(params.scope.label_selector)
        self._required = gating.require_roles.values if gating.require_roles else ()
        self._selectors = tuple(
            (s.name, s.header_name.lower(), s.label_key, s.mode == STRICT)
            for s in params.header_selectors
        )
        self._strict = tuple(s for s in self._selectors if s[3])
        self._pods = PodRevisions()
        self._dist = Distribution()
        self._scratch = f"{self.TYPE}:{self.typed_name.name}"
        """Request attribute (not a data key) holding the stamps of the request's targets."""
        self._share = metric_family(
            handle.registry,
            Gauge,
            SHARE_METRIC,
            "Current weighted revision gating share from 0 to 1; incomplete revisions have "
            "share 0.",
            ("plugin_type", "plugin_name", "mode", "revision"),
        )
        self._no_match = metric_family(
            handle.registry,
            Counter,
            NO_MATCH_METRIC,
            "Strict header selections that matched no endpoint and failed closed.",
            ("plugin_type", "plugin_name", "selector"),
        )

    # ---- EndpointExtractor: the pods per revision and role --------------------------------------

    def extract_endpoint(self, event: EndpointEvent) -> Mapping[str, Any] | None:
        if not self._gating.active:
            return None
        endpoint = event.endpoint
        labels = endpoint.labels
        revision = labels.get(self._gating.revision_label, "")
        role = labels.get(self._gating.role_label, "")
        counted = event.type is EndpointEventType.ADD_OR_UPDATE and revision and role
        if counted and self._scope.matches(labels):
            changed = self._pods.put(endpoint.id, pod_key(endpoint), revision, role)
        else:
            changed = self._pods.remove(endpoint.id)
        if changed:
            self._rebuild()
        return None

    def _rebuild(self) -> None:
        previous = self._dist
        self._dist = distribution(self._pods.role_counts(), self._required, self._gating.mode)
        labels = (self.TYPE, self.typed_name.name, self._gating.mode)
        for revision in previous.role_counts:
            if revision not in self._dist.role_counts:
                self._share.remove(*labels, revision)
        for revision in self._dist.role_counts:
            self._share.labels(*labels, revision).set(self._dist.shares.get(revision, 0.0))

    # ---- Screener -------------------------------------------------------------------------------

    def screen(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        current = endpoints
        if self._gating.active:
            current = self._gate(cycle, request, current)
            if not current:
                return current
        return self._strict_screen(request, current)

    def _gate(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        """Only covered revisions; one of them, drawn by share, unless a strict header chose."""
        key = self._gating.revision_label
        shares = self._dist.shares
        seen = {e.labels.get(key, "") for e in endpoints}
        allowed = {r: shares[r] for r in seen if r in shares}
        chosen = ""
        if len(allowed) > 1 and not self._has_strict_header(request):
            chosen = pick_revision(allowed, cycle.rng.random())
        if chosen:
            return [e for e in endpoints if e.labels.get(key) == chosen]
        return [e for e in endpoints if e.labels.get(key, "") in allowed]

    def _has_strict_header(self, request: InferenceRequest) -> bool:
        return any(request.headers.get(header) for _, header, _, _ in self._strict)

    def _strict_screen(
        self, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        current = endpoints
        for name, header, label, _ in self._strict:
            wanted = request.headers.get(header)
            if not wanted or not current:
                continue
            current = [e for e in current if e.labels.get(label) == wanted]
            if not current:
                self._no_match.labels(self.TYPE, self.typed_name.name, name).inc()
        return current

    # ---- PreRequest and ResponseHeaders: stamping the served endpoint's labels -------------------

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        if not self._selectors:
            return
        request.attributes[self._scratch] = tuple(
            (e.hostport, self._stamps(e)) for e in result.primary.targets
        )

    def _stamps(self, endpoint: Endpoint) -> dict[str, str]:
        labels = endpoint.labels
        return {h: labels[label] for _, h, label, _ in self._selectors if labels.get(label)}

    def response_headers(
        self, request: InferenceRequest, response: ResponseInfo, set_headers: dict[str, str]
    ) -> None:
        targets: tuple[tuple[str, dict[str, str]], ...] = request.attributes.get(self._scratch, ())
        if not targets:
            return
        served = response.served_endpoint
        stamps = next((s for hostport, s in targets if hostport == served), targets[0][1])
        set_headers.update(stamps)

    # ---- StateDumper ----------------------------------------------------------------------------

    def dump_state(self) -> Mapping[str, Any]:
        return {
            "mode": self._gating.mode,
            "podsByRevisionAndRole": self._dist.role_counts,
            "shares": dict(self._dist.shares),
        }
