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


class PluginRegistry:
    """Type name → entry point. Construct with ``from_entry_points()`` or from a list in tests."""

    def __init__(self, infos: Iterable[PluginInfo]) -> None:
        self._infos: dict[str, PluginInfo] = {}
        for info in infos:
            seen = self._infos.get(info.type)
            if seen is not None and seen.target != info.target:
                raise DuplicatePluginType(
                    f"plugin type {info.type!r} is registered twice: by "
                    f"{seen.distribution} {seen.version} ({seen.target}) and by "
                    f"{info.distribution} {info.version} ({info.target})"
                )
            self._infos[info.type] = info
        self._loaded: dict[str, type[Any]] = {}

    @classmethod
    def from_entry_points(cls) -> PluginRegistry:
        infos = []
        # Walk distributions (not entry_points()) so each entry point knows its distribution, and
        # so a type claimed by two distributions is seen twice instead of being deduplicated.
        seen_dists: set[str] = set()
        for dist in metadata.distributions():
            name = dist.metadata["Name"] or "?"
            key = f"{name}=={dist.version}"
            if key in seen_dists:
                continue
            seen_dists.add(key)
            for ep in dist.entry_points:
                if ep.group == GROUP:
                    infos.append(PluginInfo(ep.name, ep.value, name, dist.version, ep))
        return cls(infos)

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
