"""A type name two distributions claim: start-up refuses it, a listing keeps every claim."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

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


class Recorded(metadata.PathDistribution):
    """A distribution on disk that records which of its metadata files were read."""

    def __init__(self, path: Path, reads: list[str]) -> None:
        super().__init__(path)
        self.reads = reads

    def read_text(self, filename: str) -> str | None:
        self.reads.append(f"{self._path.name}/{filename}")  # type: ignore[attr-defined]
        return super().read_text(filename)


def dist_info(root: Path, name: str, entry_points: str | None) -> Path:
    d = root / f"{name}-1.0.dist-info"
    d.mkdir()
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    if entry_points is not None:
        (d / "entry_points.txt").write_text(entry_points)
    return d


PLUGINS = "my-scorer = pkg.mod:MyScorer\nmy-filter = pkg.mod:MyFilter"


def test_only_distributions_that_register_plugins_have_their_metadata_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # parsing every installed distribution's METADATA, and it again per plugin for its version,
    # cost 0.4 s at each start: now once, for a distribution that registers plugins
    reads: list[str] = []
    dists = [
        Recorded(dist_info(tmp_path, "plugins", f"[{GROUP}]\n{PLUGINS}\n"), reads),
        Recorded(dist_info(tmp_path, "cli", "[console_scripts]\ntool = pkg.cli:main\n"), reads),
        Recorded(dist_info(tmp_path, "plain", None), reads),
    ]
    monkeypatch.setattr(metadata, "distributions", lambda: iter(dists))
    reg = PluginRegistry.from_entry_points()
    assert reg.types() == ["my-filter", "my-scorer"]
    info = reg.info("my-scorer")
    assert (info.distribution, info.version, info.target) == ("plugins", "1.0", "pkg.mod:MyScorer")
    assert [r for r in reads if r.endswith("/METADATA")] == ["plugins-1.0.dist-info/METADATA"]
