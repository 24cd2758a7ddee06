from __future__ import annotations

from epp.plugin import Filter, NoParams
from epp.plugin.testing import check_filter, check_plugin_class, sample_endpoints
from filters.decode import DecodeFilter
from tests.builders import handle
from tests.unit.filters._roles import endpoints, kept_roles


def _filter() -> DecodeFilter:
    return DecodeFilter(name="decode-filter", params=NoParams(), handle=handle())


def test_keeps_decode_roles_and_unlabeled_pods_in_order() -> None:
    assert kept_roles(_filter()) == [
        None,
        "decode",
        "prefill-decode",
        "both",
        "encode-prefill-decode",
    ]


def test_only_prefill_pods_leave_nothing() -> None:
    prefill_only = [ep for ep in endpoints() if ep.labels.get("llm-d.ai/role") == "prefill"]
    assert _filter().filter(None, None, prefill_only) == []  # type: ignore[arg-type]


def test_contract() -> None:
    check_plugin_class(DecodeFilter, "decode-filter")
    flt = _filter()
    assert isinstance(flt, Filter)
    check_filter(flt, endpoints())
    check_filter(flt, sample_endpoints(7))
