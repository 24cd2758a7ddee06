"""A type name two distributions claim: start-up refuses it, a listing keeps every claim."""

from __future__ import annotations

from importlib import metadata

import pytest

from epp.plugin.errors import DuplicatePluginType
from epp.plugin.registry import GROUP, PluginInfo, PluginRegistry


def info(type_name: str, target: str, dist: str) -> PluginInfo:
    return PluginInfo(type_name, target, dist, "1.0", metadata.EntryPoint(type_name, target, GROUP))


CLAIMS = [
    info("a-scorer", "one:A", "one"),
    info("b-filter", "one:B", "one"),
    info("a-scorer", "two:A", "two"),
    info("a-scorer", "three:A", "three"),
]


def test_strict_registry_refuses_a_clash_naming_both_claims() -> None:
    with pytest.raises(
        DuplicatePluginType, match=r"'a-scorer' is registered twice: by one 1\.0 .* and by two"
    ):
        PluginRegistry(CLAIMS)


def test_lenient_registry_reports_every_claim_and_keeps_the_rest() -> None:
    reg = PluginRegistry(CLAIMS, strict=False)
    assert reg.types() == ["b-filter"]
    assert {t: [c.distribution for c in cs] for t, cs in reg.clashes().items()} == {
        "a-scorer": ["one", "two", "three"]
    }
    assert "a-scorer" not in reg


def test_the_same_target_twice_is_no_clash() -> None:
    reg = PluginRegistry([CLAIMS[0], CLAIMS[0]])
    assert reg.types() == ["a-scorer"] and reg.clashes() == {}
