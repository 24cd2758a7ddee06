"""``AppHandle``: the ``epp.plugin.Handle`` one App gives its plugins.

It sees the App only through what it is given (the App's registry, plugin lookup, endpoint
snapshot, the cross-replica nudge and the plugin factory), so the contract's one implementation
lives below the App in the layers and holds no state of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from epp.config.builder import PluginFactory
from epp.plugin import Endpoint, TypedName


class AppHandle:
    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        plugin: Callable[[str], Any],
        endpoints: Callable[[], Sequence[Endpoint]],
        share_soon: Callable[[], None],
        factory: PluginFactory,
    ) -> None:
        self._registry = registry
        self._plugin = plugin
        self._endpoints = endpoints
        self._share_soon = share_soon
        self._factory = factory

    @property
    def registry(self) -> CollectorRegistry:
        return self._registry

    def clock(self) -> float:
        return time.monotonic()

    def plugin(self, name: str) -> Any:
        return self._plugin(name)

    def endpoints(self) -> Sequence[Endpoint]:
        return self._endpoints()

    def logger(self, typed_name: TypedName) -> logging.Logger:
        return logging.getLogger(f"epp.plugin.{typed_name}")

    def share_soon(self) -> None:
        self._share_soon()

    def create_plugin(
        self, type_name: str, name: str, parameters: Mapping[str, Any] | None = None
    ) -> Any:
        return self._factory.create(type_name, name, parameters, self)
