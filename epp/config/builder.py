"""Building plugin instances: the factory (one instance from a type name and its YAML
parameters) and the loader's builder (every configured instance by name, in declaration order)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epp.config.errors import ConfigError
from epp.plugin import Handle, PluginConfigError, Stability
from epp.plugin.params import ParamError, decode
from epp.plugin.registry import PluginRegistry


class PluginFactory:
    """Builds one plugin instance from its type name and YAML ``parameters``: loads the class
    from the registry, applies the stability gate, decodes the parameters strictly and
    constructs it. The loader uses it for every configured plugin, and ``Handle.create_plugin``
    for plugins composed of others."""

    def __init__(self, registry: PluginRegistry, *, allow_experimental: bool = False) -> None:
        self.registry = registry
        self.allow_experimental = allow_experimental

    def create(
        self, type_name: str, name: str, parameters: Any, handle: Handle, *, system: bool = False
    ) -> Any:
        """``system``: an instance the EPP itself needs, no config named (upstream builds those
        outside its plugin registry), so the alpha gate does not apply."""
        cls = self.registry.load(type_name)
        stability = getattr(cls, "STABILITY", Stability.BETA)
        if stability is Stability.ALPHA and not (self.allow_experimental or system):
            raise ConfigError(
                f"plugin {name!r} (type {type_name!r}) is alpha; "
                "start with --allow-experimental-plugins to use it"
            )
        try:
            params = decode(cls.Params, parameters)
        except ParamError as exc:
            raise PluginConfigError(
                plugin=name, type_name=type_name, path=exc.path, problem=exc.problem
            ) from None
        try:
            return cls(name=name, params=params, handle=handle)
        except (ValueError, TypeError, KeyError) as exc:
            raise PluginConfigError(
                plugin=name, type_name=type_name, path="", problem=str(exc)
            ) from None


class Builder:
    """Phase 2 state: instances by name, in declaration order."""

    def __init__(
        self, registry: PluginRegistry, handle_for: Callable[[], Handle], allow_experimental: bool
    ) -> None:
        self.registry = registry
        self.factory = PluginFactory(registry, allow_experimental=allow_experimental)
        self.handle = handle_for()
        self.instances: dict[str, Any] = {}

    def add(
        self, type_name: str, name: str = "", parameters: Any = None, *, system: bool = False
    ) -> Any:
        name = name or type_name
        if name in self.instances:
            raise ConfigError(f"config: plugins: duplicate plugin name {name!r}")
        inst = self.factory.create(type_name, name, parameters, self.handle, system=system)
        self.instances[name] = inst
        return inst

    def ensure(self, type_name: str) -> Any:
        """The instance named ``type_name``, created with default parameters if absent."""
        return self.instances.get(type_name) or self.add(type_name)

    def ref(self, name: str, where: str) -> Any:
        inst = self.instances.get(name)
        if inst is None:
            # Upstream auto-instantiates a referenced-but-undeclared plugin when it names a type.
            if name in self.registry:
                return self.add(name)
            raise ConfigError(f"config: {where}: pluginRef {name!r} names no declared plugin")
        return inst

    def of(self, role: type) -> list[Any]:
        return [p for p in self.instances.values() if isinstance(p, role)]
