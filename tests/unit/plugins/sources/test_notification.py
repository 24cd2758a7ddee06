"""``endpoint-notification-source``: a never-polled source that passes endpoint events on."""

from __future__ import annotations

from epp.plugin import (
    DataSource,
    EndpointEvent,
    EndpointEventType,
    EndpointSource,
    NoParams,
    StateDumper,
)
from epp.plugin.testing import check_plugin_class
from epp.plugins.sources.notification import EndpointNotificationSource
from tests.builders import handle, make_endpoint


def test_source_passes_events_through_unchanged_and_counts_them() -> None:
    check_plugin_class(EndpointNotificationSource, "endpoint-notification-source")
    source = EndpointNotificationSource(name="", params=NoParams(), handle=handle())
    assert source.typed_name.name == "endpoint-notification-source"
    assert isinstance(source, EndpointSource) and isinstance(source, StateDumper)
    assert not isinstance(source, DataSource)  # the collector never polls it
    event = EndpointEvent(EndpointEventType.DELETE, make_endpoint(0))
    assert source.notify_endpoint(event) is event
    assert source.dump_state() == {"events": {"add-or-update": 0, "delete": 1}}
