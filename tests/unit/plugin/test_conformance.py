"""Start-up and the contract kit share one definition of a filter, scorer and picker: a scorer
without ``category`` fails both, with the same reason."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from epp.config.loader import ConfigError, load_config
from epp.plugin import PluginBase, ScorerCategory
from epp.plugin.conformance import SCHEDULING_ROLES, explain_refusal, members, problems
from epp.plugin.protocols import Filter, Picker, Scorer
from epp.plugin.registry import GROUP, PluginInfo, PluginRegistry
from epp.plugin.testing import check_producer, check_scorer, sample_endpoints, sample_request
from tests.builders import handle
from tests.conftest import epp_config


class NoCategory(PluginBase):
    TYPE = "no-category-scorer"

    @dataclass(frozen=True)
    class Params:
        pass

    def score(self, cycle: Any, request: Any, endpoints: Sequence[Any]) -> Mapping[str, float]:
        return {e.id: 0.5 for e in endpoints}


class WrongCategory(NoCategory):
    category = "Affinity"


class Complete(NoCategory):
    category = ScorerCategory.DISTRIBUTION


def test_the_roles_are_the_protocols_members() -> None:
    assert {"filter": Filter, "scorer": Scorer, "picker": Picker} == SCHEDULING_ROLES
    assert members(Scorer) == {"typed_name", "category", "score"}
    assert members(Filter) == {"typed_name", "filter"}
    assert members(Picker) == {"typed_name", "pick"}


def test_a_scorer_needs_a_scorer_category() -> None:
    plugin = NoCategory(name="s", params=None, handle=None)
    assert problems(plugin, "scorer") == [
        "missing `category` (a class attribute: ScorerCategory.AFFINITY, DISTRIBUTION or BALANCE)"
    ]
    assert "as a scorer: missing `category`" in explain_refusal(plugin)
    wrong = WrongCategory(name="s", params=None, handle=None)
    assert problems(wrong, "scorer") == ["`category` is 'Affinity', not a ScorerCategory"]
    assert problems(Complete(name="s", params=None, handle=None), "scorer") == []


@pytest.mark.parametrize("cls", [NoCategory, WrongCategory])
def test_the_kit_refuses_what_startup_refuses(cls: type[NoCategory]) -> None:
    with pytest.raises(AssertionError, match="start-up refuses it as a scorer"):
        check_scorer(cls(name="s", params=None, handle=None), sample_endpoints(3))
    check_scorer(Complete(name="s", params=None, handle=None), sample_endpoints(3))


@pytest.mark.parametrize("cls", ["NoCategory", "WrongCategory", "Complete"])
def test_startup_refuses_what_the_kit_refuses(cls: str, tmp_path: Path) -> None:
    target = f"{__name__}:{cls}"
    info = PluginInfo(
        "no-category-scorer",
        target,
        "mine",
        "0",
        metadata.EntryPoint("no-category-scorer", target, GROUP),
    )
    base = PluginRegistry.from_entry_points()
    registry = PluginRegistry([base.info(t) for t in base.types()] + [info])
    endpoints = tmp_path / "eps.yaml"
    endpoints.write_text("[]\n")
    text = epp_config(
        endpoints,
        """\
        plugins:
        - type: no-category-scorer
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: no-category-scorer
        """,
    )
    build = lambda: load_config(text, registry=registry, handle_for=handle)  # noqa: E731
    if cls == "Complete":
        build()
        return
    with pytest.raises(ConfigError, match=r"is not a filter, scorer or picker \(as a scorer: "):
        build()


class ForeignKeyProducer(PluginBase):
    """Publishes under another producer's name: consumers of its keys would never find it."""

    TYPE = "foreign-key-producer"

    @dataclass(frozen=True)
    class Params:
        pass

    def produces(self) -> frozenset[str]:
        return frozenset({"Toy/someone-else"})

    async def produce(self, request: Any, endpoints: Sequence[Any]) -> None:
        request.attributes["Toy/someone-else"] = 1


class OwnKeyProducer(ForeignKeyProducer):
    def produces(self) -> frozenset[str]:
        return frozenset({"Toy/foreign-key-producer"})

    async def produce(self, request: Any, endpoints: Sequence[Any]) -> None:
        request.attributes["Toy/foreign-key-producer"] = 1


@pytest.mark.parametrize("cls", ["ForeignKeyProducer", "OwnKeyProducer"])
async def test_startup_and_kit_agree_on_a_producer(cls: str, tmp_path: Path) -> None:
    target = f"{__name__}:{cls}"
    ep = metadata.EntryPoint("foreign-key-producer", target, GROUP)
    info = PluginInfo("foreign-key-producer", target, "mine", "0", ep)
    base = PluginRegistry.from_entry_points()
    registry = PluginRegistry([base.info(t) for t in base.types()] + [info])
    endpoints = tmp_path / "eps.yaml"
    endpoints.write_text("[]\n")
    text = epp_config(endpoints, "plugins:\n- type: foreign-key-producer\n")
    plugin = globals()[cls](name="foreign-key-producer", params=None, handle=None)
    reason = "produces() key 'Toy/someone-else' is not '<data type>/foreign-key-producer'"
    if cls == "OwnKeyProducer":
        load_config(text, registry=registry, handle_for=handle)
        await check_producer(plugin, sample_request(), [])
        return
    with pytest.raises(ConfigError, match=re.escape(f"refused as a producer: {reason}")):
        load_config(text, registry=registry, handle_for=handle)
    with pytest.raises(AssertionError, match=re.escape(f"as a producer: {reason}")):
        await check_producer(plugin, sample_request(), [])
