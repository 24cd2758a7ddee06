from __future__ import annotations

import logging
import textwrap
from typing import Any, ClassVar

import pytest

from epp.config.loader import LoadOptions, load_config
from epp.config.pipeline import Pipeline
from epp.plugin import (
    AGENT_IDENTITY,
    InferenceRequest,
    PluginBase,
    RequestHeaderProcessor,
    Stability,
    TypedName,
    agent_identity,
)
from epp.plugin.params import decode
from epp.plugin.registry import PluginRegistry
from epp.plugin.testing import check_plugin_class
from epp.plugins.flow.turn_priority import TurnPriority
from epp.plugins.hooks.agent_identity import AgentIdentity
from epp.requestcontrol.director import Director
from epp.requestcontrol.objectives import ObjectiveStore
from epp.scheduling.scheduler import Scheduler
from tests.builders import FakeHandle, handle, make_request

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def _plugin(**params: Any) -> AgentIdentity:
    return AgentIdentity(name="ai", params=decode(AgentIdentity.Params, params), handle=handle())


def _identity(plugin: AgentIdentity, headers: dict[str, str]) -> str | None:
    request = make_request(headers=headers)
    plugin.request_header(request)
    return request.attributes.get(AGENT_IDENTITY)


def test_contract() -> None:
    check_plugin_class(AgentIdentity, "agent-identity")
    assert AgentIdentity.STABILITY is Stability.ALPHA
    assert isinstance(_plugin(), RequestHeaderProcessor)
    assert AGENT_IDENTITY == "agent-identity/"  # upstream's NewDataKey("agent-identity", "")


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"x-claude-code-session-id": "cc", "session-id": "cx"}, "cc", id="claude"),
        pytest.param({"x-session-affinity": "oc", "session_id": "old"}, "oc", id="opencode"),
        pytest.param({"session-id": "cx", "session_id": "old"}, "cx", id="codex"),
        pytest.param({"session_id": "old"}, "old", id="codex-legacy"),
        pytest.param({"x-claude-code-session-id": "", "session_id": "old"}, "old", id="skip-empty"),
        pytest.param({"x-session-id": "not-an-agent-header"}, None, id="no-match"),
        pytest.param({"session-id": " padded "}, " padded ", id="value-as-sent"),
    ],
)
def test_first_non_empty_builtin_header_wins(headers: dict[str, str], expected: str | None) -> None:
    assert _identity(_plugin(), headers) == expected


def test_additional_headers_come_first_and_match_lower_cased() -> None:
    plugin = _plugin(additionalSessionHeaders=["X-My-Agent", "x-other"])
    assert plugin.headers[:2] == ("x-my-agent", "x-other")
    both = {"x-claude-code-session-id": "cc", "x-other": "o", "x-my-agent": "m"}
    assert _identity(plugin, both) == "m"
    assert _identity(plugin, {"x-claude-code-session-id": "cc", "x-other": "o"}) == "o"
    assert _identity(plugin, {"x-claude-code-session-id": "cc"}) == "cc"


# ---- the Director: processors run at new_request, agent identity becomes the fairness id -----


class _Raising(PluginBase):
    TYPE: ClassVar[str] = "raising-processor"

    def request_header(self, request: InferenceRequest) -> None:
        raise RuntimeError("boom")


def _pipeline(plugins: str) -> Pipeline:
    return load_config(
        HEAD + textwrap.dedent(plugins),
        registry=PluginRegistry.from_entry_points(),
        handle_for=FakeHandle,
        options=LoadOptions(allow_experimental=True),
    )


def _director(pipeline: Pipeline) -> Director:
    scheduler = Scheduler(
        profiles=pipeline.profiles,
        handler=pipeline.profile_handler,
        observe=lambda *_: None,
        count_error=lambda *_: None,
    )
    return Director(
        pipeline=pipeline,
        scheduler=scheduler,
        endpoints=list,
        objectives=ObjectiveStore(),
        clock=lambda: 0.0,
    )


PROCESSORS = """\
    plugins:
    - type: agent-identity
      parameters: {additionalSessionHeaders: [x-agent-run]}
    - type: queue-scorer
    """


def test_pipeline_slots_request_header_processors_in_config_order() -> None:
    pipeline = _pipeline(PROCESSORS)
    assert [p.typed_name.type for p in pipeline.request_header] == ["agent-identity"]
    assert _pipeline("plugins:\n- type: queue-scorer\n").request_header == []


@pytest.mark.parametrize(
    ("headers", "fairness"),
    [
        pytest.param({"x-claude-code-session-id": "cc-1"}, "cc-1", id="agent-identity"),
        pytest.param({"x-agent-run": "run-9", "session-id": "cx"}, "run-9", id="additional"),
        pytest.param(
            {"x-llm-d-inference-fairness-id": "tenant-a", "session-id": "cx"},
            "tenant-a",
            id="fairness-header-wins",
        ),
        pytest.param(
            {"x-gateway-inference-fairness-id": "tenant-b", "session-id": "cx"},
            "tenant-b",
            id="deprecated-fairness-header-wins",
        ),
        pytest.param({"x-other": "1"}, "default-flow", id="neither"),
    ],
)
def test_agent_identity_is_the_fairness_id_without_a_fairness_header(
    headers: dict[str, str], fairness: str
) -> None:
    request = _director(_pipeline(PROCESSORS)).new_request(headers)
    assert request.fairness_id == fairness


def test_attribute_is_published_even_when_a_fairness_header_is_set() -> None:
    director = _director(_pipeline(PROCESSORS))
    request = director.new_request({"x-llm-d-inference-fairness-id": "t", "session-id": "cx"})
    assert agent_identity(request) == "cx"


def test_without_processors_agent_headers_do_not_change_the_fairness_id() -> None:
    director = _director(_pipeline("plugins:\n- type: queue-scorer\n"))
    assert director.new_request({"session-id": "cx"}).fairness_id == "default-flow"


def test_a_raising_processor_is_logged_and_the_request_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pipeline = _pipeline(PROCESSORS)
    raising = _Raising(name="bad", params=None, handle=handle())
    assert raising.typed_name == TypedName("raising-processor", "bad")
    pipeline.request_header.insert(0, raising)
    with caplog.at_level(logging.ERROR):
        request = _director(pipeline).new_request({"session-id": "cx", "x-request-id": "r1"})
    assert request.request_id == "r1"
    assert request.fairness_id == "cx"  # the processors after it still ran
    (failed,) = [r for r in caplog.records if r.getMessage() == "request-header processor failed"]
    assert (getattr(failed, "plugin", ""), getattr(failed, "request_id", "")) == (
        "bad/raising-processor",
        "r1",
    )


# ---- turn-priority reads the attribute when none of its own headers is present ---------------


def test_turn_priority_falls_back_to_the_agent_identity_attribute() -> None:
    plugin = TurnPriority(name="tp", params=decode(TurnPriority.Params, {}), handle=handle())
    own = make_request(headers={"session-id": "cx"}, attributes={AGENT_IDENTITY: "other"})
    assert plugin.session_key(own) == "cx"  # its documented headers still come first
    known_elsewhere = make_request(headers={"x-agent-run": "r"}, attributes={AGENT_IDENTITY: "r"})
    assert plugin.session_key(known_elsewhere) == "r"
    plugin.on_dispatch(known_elsewhere, 0.0)
    assert plugin.adjusted_priority(known_elsewhere, 1.0) == 1
    assert plugin.session_key(make_request(headers={"x-agent-run": "r"})) == ""
