"""What every plugin is, whatever its extension point (llm-d's ``framework/interface/plugin``).

A plugin has a typed name (``Plugin``), its parameters (``NoParams`` when it takes none) and the
``Handle`` the framework gives it at construction; ``PluginBase`` stores the three. Any plugin
may also fill the roles here, which belong to no single extension point: ``Consumer`` (the
request attributes it needs, so that the loader finds their producers), ``Lifecycle`` (start and
stop: its own tasks and I/O), ``ReadinessChecker`` (gates the EPP's readiness) and
``StateDumper`` (its state in the admin API).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from epp.plugin.keys import DataKey
from epp.plugin.types import (
    Endpoint,
    Stability,
    TypedName,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


@dataclass(frozen=True)
class NoParams:
    """Parameters of a plugin that takes none."""


class Handle(Protocol):
    """What the framework gives a plugin at construction."""

    @property
    def registry(self) -> CollectorRegistry: ...

    def clock(self) -> float: ...

    def plugin(self, name: str) -> Any: ...

    def endpoints(self) -> Sequence[Endpoint]: ...

    def logger(self, typed_name: TypedName) -> logging.Logger: ...

    def share_soon(self) -> None:
        """The calling plugin (a ``SharedState``) has just recorded facts other replicas should
        have at once (a new binding, new prefix blocks): the sync engine publishes at once (under
        a burst, within 5 to 20 ms) instead of at its next interval. Cheap enough for
        the request path (a flag set); a no-op without a cross-replica syncer. Facts still travel
        only through ``export_facts``."""
        ...

    def create_plugin(
        self, type_name: str, name: str, parameters: Mapping[str, Any] | None = None
    ) -> Any:
        """A new instance of the plugin type ``type_name``, built as the loader builds a configured
        one (strict ``parameters``, the stability gate). For plugins composed of others: the
        instance is the caller's; it is not registered, and the caller forwards its hooks."""
        ...


class PluginBase:
    """Convenience base: stores the typed name, params and handle."""

    TYPE: ClassVar[str] = ""
    STABILITY: ClassVar[Stability] = Stability.BETA
    Params: ClassVar[type[Any]] = NoParams

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        self.typed_name = TypedName(type=self.TYPE, name=name or self.TYPE)
        self.params = params
        self.handle = handle


@runtime_checkable
class Plugin(Protocol):
    typed_name: TypedName


@runtime_checkable
class Consumer(Protocol):
    """Declares the request attribute keys a plugin needs; the loader finds producers for them."""

    typed_name: TypedName

    def consumes(self) -> frozenset[DataKey[Any]]: ...


@runtime_checkable
class Lifecycle(Protocol):
    typed_name: TypedName

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class ReadinessChecker(Protocol):
    typed_name: TypedName

    def is_ready(self) -> bool: ...


@runtime_checkable
class StateDumper(Protocol):
    typed_name: TypedName

    def dump_state(self) -> Mapping[str, Any]: ...
