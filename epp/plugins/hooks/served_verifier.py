"""``destination-endpoint-served-verifier`` (test plugin, as upstream).

Copies the data plane's served-endpoint metadata (``envoy.lb`` →
``x-gateway-destination-endpoint-served``) into the response header
``x-conformance-test-served-endpoint``, or ``fail: missing destination endpoint served metadata``
when the data plane did not report it. Gateway API Inference Extension conformance
(``GatewayDestinationEndpointServed``) reads that header.

YAML::

    plugins:
    - type: destination-endpoint-served-verifier
"""

from __future__ import annotations

from typing import ClassVar

from epp.plugin import InferenceRequest, PluginBase, ResponseInfo

HEADER = "x-conformance-test-served-endpoint"


class ServedEndpointVerifier(PluginBase):
    TYPE: ClassVar[str] = "destination-endpoint-served-verifier"

    def response_headers(
        self, request: InferenceRequest, response: ResponseInfo, set_headers: dict[str, str]
    ) -> None:
        set_headers[HEADER] = (
            response.served_endpoint or "fail: missing destination endpoint served metadata"
        )
