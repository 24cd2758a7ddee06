"""``disagg-headers-handler`` and ``prefill-header-handler`` (both deprecated): the P/D sidecar
headers as a separate PreRequest plugin.

``disagg-profile-handler`` sets these headers itself; these types remain for configs written for
``pd-profile-handler`` (upstream deprecated them in v0.9 and plans their removal in v0.11).
After scheduling, on the request the decode pod receives:

- ``x-prefiller-host-port: <ip:port>``: the first target of profile ``prefillProfile``;
- ``x-encoder-hosts-ports: <ip:port,...>``: every target of profile ``encodeProfile``;

a header whose profile did not run, or picked nothing, is not sent, and a value the client sent
for either is removed. ``prefill-header-handler`` is an alias of ``disagg-headers-handler``
(same parameters, same behaviour). The deprecation is logged when the plugin is built.

Parameters:

- ``prefillProfile`` (string, default ``prefill``).
- ``encodeProfile`` (string, default ``encode``).

YAML::

    plugins:
      - type: pd-profile-handler
      - type: prefill-header-handler
        parameters:
          prefillProfile: my-prefill
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from epp.plugin import Handle, InferenceRequest, PluginBase, SchedulingResult
from epp.plugin.roles import write_disagg_headers


class DisaggHeadersHandler(PluginBase):
    TYPE: ClassVar[str] = "disagg-headers-handler"

    @dataclass(frozen=True)
    class Params:
        prefill_profile: str = "prefill"
        encode_profile: str = "encode"

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        handle.logger(self.typed_name).info(
            "Deprecated: plugin type %r is deprecated (planned removal in v0.11), "
            "use 'disagg-profile-handler', which sets these headers itself",
            self.TYPE,
        )

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        write_disagg_headers(
            request,
            result,
            prefill_profile=self.params.prefill_profile,
            encode_profile=self.params.encode_profile,
        )


class PrefillHeaderHandler(DisaggHeadersHandler):
    TYPE: ClassVar[str] = "prefill-header-handler"
