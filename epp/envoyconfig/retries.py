"""What Envoy does when a model server fails a request: the retry policy of the routes to the
model servers, and (when Envoy knows the pool's addresses) the override-host load balancing
and outlier detection of the model-server cluster.

**Which requests are retried** (``retry_on: connect-failure,refused-stream,reset``, at most
``--retries`` times, 2 by default, Envoy's jittered back-off from 25 ms):

- ``connect-failure``: no connection within ``connect_timeout`` (2 s) or refused: a dead pod, or
  one that closed its listener on SIGTERM. The request never reached a model server.
- ``refused-stream``: an HTTP/2 model server (``appProtocol: kubernetes.io/h2c``) refused the
  stream (REFUSED_STREAM, as after a GOAWAY): not processed.
- ``reset``: the connection was reset or closed before the response headers arrived: a pooled
  keep-alive connection a stopping server had just closed, or a pod killed while it held a
  request whose answer had not started (a non-streamed request mid-generation starts again).

Never retried: a response whose headers Envoy has received (and forwarded), so a streamed answer
cut mid-stream fails rather than start over; an HTTP error of the model server (4xx, and 5xx: a
503 that says "saturated" is not multiplied); a slow answer. There is no ``per_try_timeout``: a
try lasts as long as its generation, and the route timeout (``--route-timeout``) bounds the
whole request. To replay a request Envoy keeps its body, up to the listener's buffer limit
(1 MiB; 16 MiB in buffered mode): a larger request is not retried.

**How many at once.** A model-server cluster's retry budget lets up to half its requests in
flight be retries, and at least 32 (Envoy's default is 3 at once per cluster: a pod that dies
under load needs a retry for each request routed to it, and past 3 the rest failed).

**Where a retry goes.** The EPP is not asked again: ext_proc runs once per request, before the
router, and the router retries below it. So the retry's target is what the cluster does with the
EPP's destination (the ``x-gateway-destination-endpoint`` header, or ``envoy.lb`` metadata):

- ORIGINAL_DST (the default, as upstream's configs; Envoy does not know the pool): the
  destination is read again, so a retry goes to the *same* pod. That rescues a stale pooled
  connection, not a dead pod. ORIGINAL_DST takes one address: the Endpoint Picker Protocol's
  comma-separated fallback list (an EPP with ``maxNumOfEndpoints`` > 1) is an invalid host to
  it, answered 503.
- ``--pool-endpoint`` (Envoy knows the pool: fixed addresses, or a headless Service name that
  Envoy re-resolves every 5 s): the ``envoy.load_balancing_policies.override_host`` policy (Envoy
  1.35+, made for the Endpoint Picker Protocol and what Gateway API inference gateways use on a
  pool cluster they feed from the InferencePool) reads the destination as a list: the first try
  goes to the first address, each retry to the next, and past the list (the default picker names
  one pod) to the fallback policy, least request over the pool's hosts that outlier detection
  has not ejected. The ``previous_hosts`` predicate keeps a retry off a pod an earlier try failed
  on (up to 10 picks: least request favours the failed pod, idle since it died). An address
  the cluster does not hold (a pod newer than Envoy's list) is skipped the same way. Envoy
  reports the pod that served the request as ``envoy.lb`` metadata
  ``x-gateway-destination-endpoint-served``.

**Outlier detection** (with ``--pool-endpoint``): a pod is ejected after one local-origin
failure (connect failure, reset, timeout: counted apart from HTTP errors), three gateway errors
in a row (502/503/504 from it) or five 5xx in a row; for 10 s times the number of its ejections;
never more than half the pool at once. Ejection keeps retries and fallback picks off a failing
pod. It does not stop the EPP's own first pick from going there (Envoy does not check an
override host's health): keeping a dead pod out of routing is the EPP's job, which drops a pod
whose metrics scrape is refused within one scrape interval. ORIGINAL_DST gets no outlier
detection: its load balancer connects to the given address whatever the host's state.

**Active health checks** of the model servers are off by default: the EPP's scrape of every pod
(every 50 ms by default) already is one, and it decides the first pick; Envoy's own checks only
steer retries and the fallback pick. With a static address list that can name addresses with no
ready server (pods not started yet, or gone), turn them on with ``--pool-health-path /health``:
outlier detection only learns of a dead address from a failed try, so a retry could land on one
(``epp bench day2``'s rolls failed a request that way before its Envoy checked ``/health``).
With them, panic routing is off (``healthy_panic_threshold`` 0): Envoy's default spreads retries
over every address, dead ones included, once half fail their checks, as during a roll with gone
pods and replacements not up yet. A headless Service name needs none: DNS lists only ready
pods.
"""

from __future__ import annotations

from datetime import timedelta

import betterproto2
from envoy_data_plane.envoy.config.cluster.v3 import (
    CircuitBreakersThresholdsRetryBudget,
    LoadBalancingPolicy,
    LoadBalancingPolicyPolicy,
    OutlierDetection,
)
from envoy_data_plane.envoy.config.core.v3 import TypedExtensionConfig
from envoy_data_plane.envoy.config.route.v3 import RetryPolicy, RetryPolicyRetryHostPredicate
from envoy_data_plane.envoy.extensions.load_balancing_policies.least_request.v3 import (
    LeastRequest,
)
from envoy_data_plane.envoy.extensions.load_balancing_policies.override_host.v3 import (
    OverrideHost,
    OverrideHostOverrideHostSource,
)
from envoy_data_plane.envoy.extensions.retry.host.previous_hosts.v3 import PreviousHostsPredicate
from envoy_data_plane.envoy.type.metadata.v3 import MetadataKey, MetadataKeyPathSegment
from envoy_data_plane.envoy.type.v3 import Percent
from envoy_data_plane.google.protobuf import Any

from epp.envoyconfig.options import DESTINATION_HEADER, EnvoyOptions

RETRY_ON = "connect-failure,refused-stream,reset"
HOST_SELECTION_ATTEMPTS = 10
"""Picks the fallback policy may make for a retry before it settles for a host already tried.
Least request favours the idlest host, and the pod a try just failed on is the idlest (a dead
pod holds no requests) until outlier detection's ejection reaches the worker: with 3 picks, 4%
of retries in a loaded pool of four went back to the dead pod (a request failed when both its
retries did); with 10, none in 200."""
RETRY_BUDGET_PERCENT = 50.0
MIN_RETRY_CONCURRENCY = 32
LB_NAMESPACE = "envoy.lb"
SERVED_KEY = f"{DESTINATION_HEADER}-served"


def retry_policy(opts: EnvoyOptions, *, other_hosts: bool) -> RetryPolicy | None:
    """The routes' retry policy (None with ``--retries 0``); ``other_hosts``: the cluster can pick
    another host for a retry (not ORIGINAL_DST), so a retry avoids the hosts already tried."""
    if opts.retries <= 0:
        return None
    policy = RetryPolicy(retry_on=RETRY_ON, num_retries=opts.retries)
    if other_hosts:
        predicate = RetryPolicyRetryHostPredicate(
            name="envoy.retry_host_predicates.previous_hosts",
            typed_config=Any.pack(PreviousHostsPredicate()),
        )
        policy.retry_host_predicate = [predicate]
        policy.host_selection_retry_max_attempts = HOST_SELECTION_ATTEMPTS
    return policy


def retry_budget() -> CircuitBreakersThresholdsRetryBudget:
    """Retries in flight at once on a model-server cluster: up to half the requests in flight,
    and at least ``MIN_RETRY_CONCURRENCY``. Envoy's default without a budget is 3 retries at
    once per cluster: a pod that dies (or stops listening on SIGTERM) while requests are being
    routed to it needs one retry for each, and past 3 Envoy answers the rest with the failed
    try's 503 (``upstream_rq_retry_overflow``): 42 of 200 requests in a test of 8 clients with
    one dead pod of four. With the whole pool down it still bounds the retries (half the
    requests in flight), so they do not double the load on whatever comes back first."""
    return CircuitBreakersThresholdsRetryBudget(
        budget_percent=Percent(value=RETRY_BUDGET_PERCENT),
        min_retry_concurrency=MIN_RETRY_CONCURRENCY,
    )


def _metadata_key(key: str) -> MetadataKey:
    return MetadataKey(key=LB_NAMESPACE, path=[MetadataKeyPathSegment(key=key)])


def _policy(name: str, config: betterproto2.Message) -> LoadBalancingPolicy:
    typed = TypedExtensionConfig(name=name, typed_config=Any.pack(config))
    return LoadBalancingPolicy(policies=[LoadBalancingPolicyPolicy(typed_extension_config=typed)])


def override_host_policy() -> LoadBalancingPolicy:
    """The EPP's destination list first (header, else ``envoy.lb`` metadata), then least
    request; the host chosen is reported as ``envoy.lb`` ``...-served`` metadata."""
    override = OverrideHost(
        override_host_sources=[
            OverrideHostOverrideHostSource(header=DESTINATION_HEADER),
            OverrideHostOverrideHostSource(metadata=_metadata_key(DESTINATION_HEADER)),
        ],
        selected_host_key=_metadata_key(SERVED_KEY),
        fallback_policy=_policy("envoy.load_balancing_policies.least_request", LeastRequest()),
    )
    return _policy("envoy.load_balancing_policies.override_host", override)


def outlier_detection() -> OutlierDetection:
    """Eject a pod on one connect failure or reset, three gateway errors or five 5xx in a row
    (Envoy's default ``consecutive_5xx``)."""
    return OutlierDetection(
        split_external_local_origin_errors=True,
        consecutive_local_origin_failure=1,
        enforcing_consecutive_local_origin_failure=100,
        consecutive_gateway_failure=3,
        enforcing_consecutive_gateway_failure=100,
        interval=timedelta(seconds=1),
        base_ejection_time=timedelta(seconds=10),
        max_ejection_percent=50,
    )
