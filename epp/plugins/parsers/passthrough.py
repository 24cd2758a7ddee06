"""``passthrough-parser``: the fallback for paths no other parser claims.

Claims no path, which makes it the fallback of the parser list; parsers listed after it are never
consulted. The body is forwarded byte for byte (kind ``raw``, payload ``None``), the model is "",
nothing is validated and no usage is extracted from responses. It does not support model rewrite,
so a request it parses is never rejected for lacking a model.

Parameters: none. Example (OpenAI traffic parsed, everything else passed through)::

    requestHandler:
      parsers:
      - pluginRef: openai-parser
      - pluginRef: passthrough-parser
    plugins:
    - type: openai-parser
    - type: passthrough-parser
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from epp.plugin import ParsedResponse, ParseResult, RequestBody
from epp.plugins.parsers.common import ParserBase
from epp.plugins.parsers.usage import NullResponseState


class PassthroughParser(ParserBase):
    """Fallback parser that forwards bodies untouched; see the module docstring."""

    TYPE: ClassVar[str] = "passthrough-parser"
    supports_model_rewrite: ClassVar[bool] = False

    def claims(self) -> tuple[str, ...]:
        return ()

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParseResult:
        return ParseResult(model="", body=RequestBody(kind="raw", payload=None, raw=body))

    def rewrite_model(self, body: RequestBody, target_model: str) -> bytes:
        # Raw bodies carry no model the EPP understands; forward them unchanged.
        return body.raw

    def parse_response(
        self, chunk: bytes, headers: Mapping[str, str], *, streaming: bool, end_of_stream: bool
    ) -> ParsedResponse:
        return ParsedResponse()

    def new_response_state(self, headers: Mapping[str, str] | None = None) -> NullResponseState:
        return NullResponseState()
