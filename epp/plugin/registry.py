"""Plugin discovery through the ``epp.plugins`` entry-point group.

The index is built from distribution metadata without importing any plugin. Only the types a
configuration names are loaded, so a broken third-party plugin that is not configured cannot stop
the server. Two distributions claiming one type name is an error naming both, raised as soon as
the index is built.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from epp.plugin.errors import DuplicatePluginType, PluginLoadError, UnknownPluginType

GROUP = "epp.plugins"


@dataclass(frozen=True, slots=True)
class PluginInfo:
    type: str
    target: str
    distribution: str
    version: str
    entry_point: metadata.EntryPoint


def clash_message(type_name: str, claims: Iterable[PluginInfo]) -> str:
    by = " and by ".join(f"{c.distribution} {c.version} ({c.target})" for c in claims)
    return f"plugin type {type_name!r} is registered twice: by {by}"


class PluginRegistry:
    """Type name → entry point. Construct with ``from_entry_points()`` or from a list in tests."""

    def __init__(self, infos: Iterable[PluginInfo], *, strict: bool = True) -> None:
        """A type name claimed by two targets raises ``DuplicatePluginType`` (start-up), or with
        ``strict=False`` is kept out of the registry and reported by ``clashes()`` (listing)."""
        self._infos: dict[str, PluginInfo] = {}
        self._clashes: dict[str, list[PluginInfo]] = {}
        for info in infos:
            seen = self._infos.get(info.type) or next(iter(self._clashes.get(info.type, [])), None)
            if seen is not None and seen.target != info.target:
                if strict:
                    raise DuplicatePluginType(clash_message(info.type, [seen, info]))
                self._clashes.setdefault(info.type, [seen]).append(info)
                self._infos.pop(info.type, None)
                continue
            self._infos[info.type] = info
        self._loaded: dict[str, type[Any]] = {}

    def clashes(self) -> dict[str, list[PluginInfo]]:
        """Type names several distributions claim (only with ``strict=False``), with each claim."""
        return {t: list(claims) for t, claims in sorted(self._clashes.items())}

    @classmethod
    def from_entry_points(cls, *, strict: bool = True) -> PluginRegistry:
        infos = []
        # Walk distributions (not entry_points()) so each entry point knows its distribution, and
        # so a type claimed by two distributions is seen twice instead of being deduplicated.
        # Each read of a distribution's name or version parses its whole METADATA file, so only
        # the distributions whose entry_points.txt names the group are read, once each (reading
        # every one, and the version once per plugin, took 0.4 s of each start).
        seen_dists: set[str] = set()
        for dist in metadata.distributions():
            if GROUP not in (dist.read_text("entry_points.txt") or ""):
                continue
            meta = dist.metadata
            name, version = meta["Name"] or "?", meta["Version"] or "?"
            key = f"{name}=={version}"
            if key in seen_dists:
                continue
            seen_dists.add(key)
            for ep in dist.entry_points:
                if ep.group == GROUP:
                    infos.append(PluginInfo(ep.name, ep.value, name, version, ep))
        return cls(infos, strict=strict)

    def types(self) -> list[str]:
        return sorted(self._infos)

    def info(self, type_name: str) -> PluginInfo:
        try:
            return self._infos[type_name]
        except KeyError:
            raise UnknownPluginType(type_name, list(self._infos)) from None

    def __contains__(self, type_name: object) -> bool:
        return type_name in self._infos

    def load(self, type_name: str) -> type[Any]:
        """Import the class registered for ``type_name`` (cached)."""
        cached = self._loaded.get(type_name)
        if cached is not None:
            return cached
        info = self.info(type_name)
        try:
            plugin_cls = info.entry_point.load()
        except Exception as exc:
            raise PluginLoadError(
                f"plugin type {type_name!r} from {info.distribution} {info.version} "
                f"({info.target}) failed to load: {exc!r}"
            ) from exc
        declared = getattr(plugin_cls, "TYPE", None)
        if declared != type_name:
            raise PluginLoadError(
                f"entry point {type_name!r} ({info.target}) resolves to a class whose TYPE is "
                f"{declared!r}; the entry-point name must equal the plugin's TYPE"
            )
        self._loaded[type_name] = plugin_cls
        return plugin_cls  # type: ignore[no-any-return]
