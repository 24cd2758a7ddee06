"""``models-data-source`` and ``models-data-extractor``: the models each endpoint serves, from its
OpenAI-compatible ``/v1/models``, published as the endpoint attribute
``ModelDataCollection/models-data-extractor`` (``epp.plugin.attributes.SERVED_MODELS``: a tuple of
``ModelData``, base models and LoRA adapters, in the server's order) for filters and scorers.

``models-data-source`` GETs ``<scheme>://<endpoint address>:<endpoint port><path>`` over the same
keep-alive client as ``metrics-data-source`` (one connection per endpoint, closed when the endpoint
leaves). A refused connection does not take the endpoint out of routing (``metrics-data-source``
decides that). Parameters, upstream's:

* ``scheme``: ``http`` (default) or ``https``;
* ``path``: default ``/v1/models``;
* ``insecureSkipVerify``: default true; with false the server certificate is verified against
  ``caCertPath`` (or the system store when empty);
* ``clientCertPath`` / ``clientKeyPath``: client certificate for mTLS (both or neither);
* ``interval``: Go duration; empty polls every collector tick, otherwise the collector rounds it to
  a multiple of its tick. The list changes only when adapters are loaded or unloaded: ``5s`` is
  plenty.

``models-data-extractor`` (no parameters) reads the answer
``{"object": "list", "data": [{"id", "object", "created", "owned_by", "parent"}, ...]}``: each
entry with a string ``id`` becomes a ``ModelData``; fields missing or of another type take their
empty value (vLLM reports ``parent: null`` for a base model); other fields (``root``,
``max_model_len``, ``permission``) are ignored. A body that is not such a JSON object raises (an
extract error, counted in ``llm_d_epp_datalayer_extract_errors_total``; the previous list stays).

YAML::

    plugins:
    - type: models-data-source
      name: vllm-models-source
      parameters: {scheme: http, path: /v1/models, interval: 5s}
    - type: models-data-extractor
    dataLayer:
      sources:
      - pluginRef: metrics-data-source
        extractors: [{pluginRef: core-metrics-extractor}]
      - pluginRef: vllm-models-source
        extractors: [{pluginRef: models-data-extractor}]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal

import orjson

from epp.plugin import Endpoint, Handle, Metrics, PluginBase, with_attribute
from epp.plugin.attributes import SERVED_MODELS, ModelData
from epp.plugin.units import parse_duration
from epp.plugins.sources.metrics import MetricsDataSource

MAX_MODELS: Final = 10_000
"""Entries kept from one answer at most (a server lists its base model and its adapters)."""


class ModelsDataSource(MetricsDataSource):
    """Polls ``/v1/models`` of each endpoint over one shared keep-alive session."""

    TYPE: ClassVar[str] = "models-data-source"

    @dataclass(frozen=True)
    class Params:
        scheme: Literal["http", "https"] = "http"
        path: str = "/v1/models"
        insecure_skip_verify: bool = True
        interval: str = ""
        ca_cert_path: str = ""
        client_cert_path: str = ""
        client_key_path: str = ""
        port: int = field(default=0, init=False)  # always the endpoint's own port

        def __post_init__(self) -> None:
            if not self.path.startswith("/"):
                raise ValueError(f"path must start with '/', got {self.path!r}")
            if self.interval and parse_duration(self.interval) < 0:
                raise ValueError(f"interval must not be negative, got {self.interval!r}")
            if bool(self.client_cert_path) != bool(self.client_key_path):
                raise ValueError("clientCertPath and clientKeyPath must be set together")

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self.reaches_endpoint = False  # reachability is the metrics source's to judge


class ModelsDataExtractor(PluginBase):
    """``/v1/models`` → ``ModelDataCollection/models-data-extractor``."""

    TYPE: ClassVar[str] = "models-data-extractor"

    def extract(
        self, payload: bytes, endpoint: Endpoint, previous: Metrics, *, now: float
    ) -> Metrics:
        return with_attribute(previous, SERVED_MODELS, parse_models(payload))


def parse_models(payload: bytes) -> tuple[ModelData, ...]:
    """The models of a ``/v1/models`` answer (module docstring); ``ValueError`` when it is none."""
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"/v1/models answer is not JSON: {exc}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ValueError("/v1/models answer has no 'data' list")
    return tuple(
        ModelData(
            id=entry["id"],
            object=_text(entry.get("object")),
            created=_integer(entry.get("created")),
            owned_by=_text(entry.get("owned_by")),
            parent=_text(entry.get("parent")),
        )
        for entry in data[:MAX_MODELS]
        if isinstance(entry, dict) and isinstance(entry.get("id"), str)
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _integer(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
