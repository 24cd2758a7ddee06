"""Parsing (llm-d's ``framework/interface/requesthandling``): the ``Parser`` that reads a
request body for the framework (model, prompt, what the producers and scorers need), rewrites
its model, and reads a response's usage, incrementally for a stream (``ResponseState``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Protocol, runtime_checkable

from epp.plugin.types import (
    ParsedResponse,
    ParseResult,
    RequestBody,
    TypedName,
)


class ResponseState(Protocol):
    """Incremental usage extraction for one streamed response (SSE events may span chunks)."""

    def feed(self, chunk: bytes, end_of_stream: bool) -> ParsedResponse: ...


@runtime_checkable
class Parser(Protocol):
    """Request/response parser (``requestHandler.parsers``).

    ``claims`` are path suffixes; an empty tuple makes the parser the fallback.
    ``parse_request`` raises ``InferenceError`` (400) on bad input. Parsers whose
    ``supports_model_rewrite`` is true also implement ``rewrite_model``, which returns the body with
    ``model`` replaced (compact JSON, sorted keys, as upstream's Go marshal).
    """

    typed_name: TypedName
    supports_model_rewrite: ClassVar[bool]

    def claims(self) -> tuple[str, ...]: ...

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParseResult: ...

    def rewrite_model(self, body: RequestBody, target_model: str) -> bytes: ...

    def new_response_state(self, headers: Mapping[str, str] | None = None) -> ResponseState: ...

    def parse_response(
        self, chunk: bytes, headers: Mapping[str, str], *, streaming: bool, end_of_stream: bool
    ) -> ParsedResponse: ...
