from __future__ import annotations

from epp.plugin import Filter, NoParams
from epp.plugin.testing import check_filter, check_plugin_class, sample_endpoints
from filters.prefill import PrefillFilter
from tests.builders import handle
from tests.unit.filters._roles import endpoints, kept_roles


def _filter() -> PrefillFilter:
    return PrefillFilter(name="prefill-filter", params=NoParams(), handle=handle())


def test_keeps_prefill_roles_and_drops_unlabeled_pods() -> None:
    assert kept_roles(_filter()) == [
        "prefill",
        "prefill-decode",
        "both",
        "encode-prefill",
        "encode-prefill-decode",
    ]


def test_contract() -> None:
    check_plugin_class(PrefillFilter, "prefill-filter")
    flt = _filter()
    assert isinstance(flt, Filter)
    check_filter(flt, endpoints())
    check_filter(flt, sample_endpoints(7))
