"""Path-based routing of requests to parsers (``requestHandler.parsers``).

The path is the first non-empty header of ``:path``, ``x-original-path``, ``x-forwarded-path``
(default ``/v1/completions``), with the query string removed. Each parser claims path suffixes;
the longest claimed suffix that matches the path's trailing segments wins, so
``/v1/chat/completions`` goes to the ``chat/completions`` claim rather than ``completions``.
Claims are compared with leading and trailing ``/`` trimmed, and a claim matches whole segments
only: ``/v1/xcompletions`` does not match ``completions`` (a plain string-suffix test would). A
gRPC service segment (``/google.cloud.aiplatform.v1.PredictionService/RawPredict``) also matches
by its unqualified name (``PredictionService/RawPredict``), see ``epp.plugin.paths``.

Registration follows the configured order:

* a parser that claims nothing is the fallback, and registration stops there (parsers listed after
  it are ignored, with a warning);
* a second parser of an already registered type is ignored, with a warning;
* two parsers claiming the same suffix: the first one keeps it.

No match and no fallback is a 400 ``no parser found for path <path>``.

Resolution is one dictionary probe per trailing path segment (bounded by the deepest claim), so
its cost does not depend on how many parsers or claims are configured.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from epp.plugin import ErrorCode, InferenceError, Parser
from epp.plugin.paths import SuffixTable, strip_query

_log = logging.getLogger(__name__)

DEFAULT_PATH = "/v1/completions"
PATH_HEADERS: tuple[str, ...] = (":path", "x-original-path", "x-forwarded-path")


def request_path(headers: Mapping[str, str]) -> str:
    """The request path used for parser routing (query stripped); header names are lower-case."""
    for name in PATH_HEADERS:
        value = headers.get(name)
        if value:
            return strip_query(value)
    return DEFAULT_PATH


class ParserRouter:
    """Resolves the parser of a request from its path; see the module docstring."""

    def __init__(self, parsers: Sequence[Parser]) -> None:
        active: list[Parser] = []
        skipped: list[tuple[Parser, str]] = []
        seen_types: set[str] = set()
        fallback: Parser | None = None
        for index, parser in enumerate(parsers):
            kind = parser.typed_name.type
            if kind in seen_types:
                skipped.append((parser, f"parser type {kind!r} is already registered"))
                continue
            seen_types.add(kind)
            active.append(parser)
            if not parser.claims():
                fallback = parser
                reason = f"configured after fallback parser {parser.typed_name}"
                skipped.extend((later, reason) for later in parsers[index + 1 :])
                break
        self._table: SuffixTable[Parser] = SuffixTable(
            (claim, parser) for parser in active for claim in parser.claims()
        )
        self._fallback = fallback
        self._parsers = tuple(active)
        self._skipped = tuple(skipped)
        for parser, reason in self._skipped:
            _log.warning("parser %s ignored: %s", parser.typed_name, reason)

    @property
    def parsers(self) -> tuple[Parser, ...]:
        """The registered parsers in configuration order (fallback last, if any)."""
        return self._parsers

    @property
    def fallback(self) -> Parser | None:
        return self._fallback

    @property
    def skipped(self) -> tuple[tuple[Parser, str], ...]:
        """Configured parsers that were ignored, with the reason."""
        return self._skipped

    def resolve_path(self, path: str) -> Parser:
        """The parser for a query-free path."""
        parser = self._table.lookup(path) or self._fallback
        if parser is None:
            raise InferenceError(ErrorCode.BAD_REQUEST, f"no parser found for path {path}")
        return parser

    def resolve(self, headers: Mapping[str, str]) -> tuple[str, Parser]:
        """The routing path of a request and the parser that handles it."""
        path = request_path(headers)
        return path, self.resolve_path(path)
