"""``multicluster-session-affinity-filter`` pins a session to the cluster its earlier requests
went to, exactly as ``session-affinity-filter`` pins it to an endpoint (clusters are endpoints)."""

from __future__ import annotations

import base64

from epp.plugin import ProfileResult, ResponseInfo, SchedulingResult, Stability
from epp.plugin.params import decode
from epp.plugin.testing import check_filter, check_plugin_class
from filters.multicluster_session_affinity import MultiClusterSessionAffinityFilter
from tests.builders import FakeHandle, make_cycle, make_endpoint, make_request

CLUSTERS = [make_endpoint(i) for i in range(3)]


def test_a_session_stays_on_its_cluster() -> None:
    check_plugin_class(MultiClusterSessionAffinityFilter, "multicluster-session-affinity-filter")
    assert MultiClusterSessionAffinityFilter.STABILITY is Stability.ALPHA
    flt = MultiClusterSessionAffinityFilter(
        name="session-affinity",
        params=decode(MultiClusterSessionAffinityFilter.Params, {}),
        handle=FakeHandle(),
    )
    assert flt.typed_name.type == "multicluster-session-affinity-filter"
    first = make_request()
    flt.pre_request(first, SchedulingResult({"d": ProfileResult(targets=(CLUSTERS[1],))}, "d"))
    headers: dict[str, str] = {}
    flt.response_headers(first, ResponseInfo(first.request_id, {}), headers)
    token = headers["x-session-token"]
    assert base64.b64decode(token).decode() == CLUSTERS[1].id
    again = make_request(headers={"x-session-token": token})
    assert list(flt.filter(make_cycle(), again, CLUSTERS)) == [CLUSTERS[1]]
    assert list(flt.filter(make_cycle(), again, [CLUSTERS[0], CLUSTERS[2]])) == [
        CLUSTERS[0],
        CLUSTERS[2],
    ]  # its cluster left: every candidate passes
    check_filter(flt, CLUSTERS, again)
