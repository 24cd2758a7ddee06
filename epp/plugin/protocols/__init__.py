"""The plugin contract.

A plugin is a class registered under the ``epp.plugins`` entry-point group. It has a class
attribute ``TYPE`` (the type name used in YAML), a nested frozen dataclass ``Params`` (its YAML
``parameters``, camelCase in YAML, snake_case in Python) and is constructed as
``cls(name=..., params=..., handle=...)``. ``PluginBase`` does that plumbing.

Roles are ``typing.Protocol`` classes; the loader checks them once at startup with ``isinstance``
and slots the instance into every role it fills. Filters, scorers and pickers are synchronous and
pure. Only ``DataProducer.produce`` and ``Lifecycle`` hooks may do I/O.

The roles are grouped by extension point, one module each, as llm-d's ``framework/interface``
groups its interfaces: ``plugin`` (what every plugin is: ``PluginBase``, ``Handle``, and the
roles of any extension point: ``Consumer``, ``Lifecycle``, ``ReadinessChecker``,
``StateDumper``), ``scheduling``, ``requestcontrol``, ``parsing``, ``flowcontrol`` and
``datalayer``. This package names them all; plugins import them from ``epp.plugin``.
"""

from epp.plugin.protocols.datalayer import (
    DataSource,
    Discovery,
    EndpointEvent,
    EndpointEventType,
    EndpointExtractor,
    EndpointSource,
    Extractor,
)
from epp.plugin.protocols.flowcontrol import SaturationDetector
from epp.plugin.protocols.parsing import Parser, ResponseState
from epp.plugin.protocols.plugin import (
    Consumer,
    Handle,
    Lifecycle,
    NoParams,
    Plugin,
    PluginBase,
    ReadinessChecker,
    StateDumper,
)
from epp.plugin.protocols.requestcontrol import (
    Admitter,
    DataProducer,
    PreRequest,
    RequestHeaderProcessor,
    ResponseComplete,
    ResponseHeaders,
    ResponseStreaming,
    Screener,
)
from epp.plugin.protocols.scheduling import Decider, Filter, Picker, Profile, ProfileHandler, Scorer

__all__ = [
    "Admitter",
    "Consumer",
    "DataProducer",
    "DataSource",
    "Decider",
    "Discovery",
    "EndpointEvent",
    "EndpointEventType",
    "EndpointExtractor",
    "EndpointSource",
    "Extractor",
    "Filter",
    "Handle",
    "Lifecycle",
    "NoParams",
    "Parser",
    "Picker",
    "Plugin",
    "PluginBase",
    "PreRequest",
    "Profile",
    "ProfileHandler",
    "ReadinessChecker",
    "RequestHeaderProcessor",
    "ResponseComplete",
    "ResponseHeaders",
    "ResponseState",
    "ResponseStreaming",
    "SaturationDetector",
    "Scorer",
    "Screener",
    "StateDumper",
]
