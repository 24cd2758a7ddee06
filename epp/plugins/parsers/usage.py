"""Token-usage extraction from model-server responses (OpenAI, Anthropic and SGLang dialects).

Two entry points:

* ``parse_whole(dialect, body, headers)``: stateless, for a buffered (complete) response body.
* ``ResponseUsageState(dialect, headers)``: per-response object for streamed bodies. ``feed`` is
  called with each chunk as it arrives; SSE lines split across chunks are reassembled, and a JSON
  body delivered in several chunks is parsed once at end of stream.

Format detection: a ``content-type`` containing ``text/event-stream`` means SSE; otherwise the
first non-blank byte decides (``{`` is a JSON body, anything else an SSE stream). The two cannot be
confused: an SSE line starts with a field name, never with ``{``.

OpenAI (and vLLM ``/inference/v1/generate``):

* JSON body: ``usage.prompt_tokens|input_tokens``, ``usage.completion_tokens|output_tokens``,
  ``usage.prompt_tokens_details|input_tokens_details.cached_tokens``, ``usage.total_tokens``.
  Values may be numbers or numeric strings; anything else counts as 0.
* SSE: every line starting exactly with ``data: `` other than ``data: [DONE]`` is one streamed
  event; an event carrying ``usage`` contributes either its top-level ``usage`` object or, for a
  Responses API ``"type":"response.completed"`` event, ``response.usage``. Example::

      data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":10,"total_tokens":17}}

      data: [DONE]

Anthropic:

* JSON body: ``usage.input_tokens``, ``usage.output_tokens``, ``usage.cache_read_input_tokens``;
  total = input + output.
* SSE: ``message_start`` gives ``message.usage.input_tokens`` (and cached tokens),
  ``message_delta`` gives ``usage.output_tokens``. These usually arrive in different chunks, so a
  chunk reports only the fields it saw and leaves ``total_tokens`` at 0 unless it saw both halves;
  ``Usage.merge`` on the caller's side then derives the total. Streamed events are not counted.

SGLang (``/generate``):

* JSON body: ``meta_info.prompt_tokens``, ``meta_info.completion_tokens``,
  ``meta_info.cached_tokens``; total = prompt + completion.
* SSE: the first ``data: `` event whose ``meta_info.finish_reason`` is not null (SGLang's
  ``meta_info`` counts are running totals; the finishing event has the final ones). Events whose
  ``finish_reason`` is null are never decoded. Streamed events are not counted. Example::

      data: {"text":"Hi","meta_info":{"finish_reason":null,"prompt_tokens":5,"completion_tokens":1}}

      data: {"text":"Hi!","meta_info":{"finish_reason":{"type":"length","length":2},
             "prompt_tokens":5,"completion_tokens":2,"cached_tokens":3}}

      data: [DONE]

Responses API ids (OpenAI dialect): a JSON body whose ``object`` is ``response`` gives its ``id``;
in a stream, the ``response.created`` and ``response.completed`` events give ``response.id``. A
model server keeps that response's state, so a follow-up naming it in ``previous_response_id``
must reach the same server (``response-affinity-filter`` learns the binding from this id).

Malformed responses never raise: they yield ``ParsedResponse()`` (no usage).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson

from epp.plugin import ParsedResponse, Usage

DATA_PREFIX: Final = b"data: "
DONE: Final = b"[DONE]"
EVENT_STREAM: Final = "text/event-stream"

MAX_SSE_LINE: Final = 4 << 20
"""A partial SSE line longer than this is dropped (its usage, if any, is lost) so a broken stream
without newlines cannot grow the buffer without bound."""

MAX_JSON_BODY: Final = 64 << 20
"""A streamed JSON body larger than this is not buffered for usage extraction."""

_ONE_EVENT: Final = ParsedResponse(streamed_events=1)
_NOTHING: Final = ParsedResponse()
"""Shared results of the usual token chunk (``ResponseUsageState.feed``): read-only."""

_FIRST_BYTE = re.compile(rb"\s*(\S)")
_RESPONSE_ID_EVENTS: Final = frozenset({"response.created", "response.completed"})
_RESPONSE_EVENT_MARK: Final = b'"response.c'
"""Found in ``response.created``/``response.completed`` lines (and a few other event types);
token deltas (``response.output_text.delta``) never carry it, so they are never decoded."""


def to_int(value: Any) -> int:
    """Numbers and numeric strings become ints (truncated); anything else is 0."""
    if type(value) is int:
        return value
    if type(value) is float:
        return int(value) if value == value and abs(value) != float("inf") else 0
    if isinstance(value, str):
        try:
            return to_int(float(value))
        except ValueError:
            return 0
    return 0


def _first_present(obj: Mapping[str, Any], keys: tuple[str, ...]) -> int:
    # As upstream: the first key that is present and non-null decides, even if malformed.
    for key in keys:
        value = obj.get(key)
        if value is not None:
            return to_int(value)
    return 0


def openai_usage(usage: Mapping[str, Any]) -> Usage:
    """Usage from an OpenAI ``usage`` object (Chat/Completions or Responses naming)."""
    cached = 0
    for key in ("prompt_tokens_details", "input_tokens_details"):
        details = usage.get(key)
        if isinstance(details, dict) and "cached_tokens" in details:
            cached = to_int(details["cached_tokens"])
    return Usage(
        prompt_tokens=_first_present(usage, ("prompt_tokens", "input_tokens")),
        completion_tokens=_first_present(usage, ("completion_tokens", "output_tokens")),
        cached_tokens=cached,
        total_tokens=to_int(usage.get("total_tokens")),
    )


def is_event_stream(headers: Mapping[str, str] | None) -> bool:
    if not headers:
        return False
    value = headers.get("content-type")
    if value is None:
        # Callers normally lower-case header names; tolerate one that did not.
        value = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    return EVENT_STREAM in value.lower()


class OpenAIDialect:
    """Usage extraction for OpenAI-shaped responses."""

    counts_events: Final = True
    wants_by_substring: Final = True
    """``wants`` is a substring test: false for a text, it is false for every part of it."""

    @staticmethod
    def wants(content: bytes) -> bool:
        """Whether an SSE event may carry usage or a response id (else it is never decoded).
        ``find``, not ``in``: a ``bytes in bytes`` test first tries the needle as an integer and
        pays for the ``TypeError`` it clears, twice the cost on every streamed token."""
        return content.find(b"usage") >= 0 or content.find(_RESPONSE_EVENT_MARK) >= 0

    @staticmethod
    def body_usage(obj: Any) -> Usage | None:
        usage = obj.get("usage") if isinstance(obj, dict) else None
        return openai_usage(usage) if isinstance(usage, dict) else None

    @staticmethod
    def body_response_id(obj: Any) -> str:
        if isinstance(obj, dict) and obj.get("object") == "response":
            rid = obj.get("id")
            return rid if isinstance(rid, str) else ""
        return ""

    @staticmethod
    def events_response_id(events: Iterable[dict[str, Any]]) -> str:
        for event in events:
            if event.get("type") in _RESPONSE_ID_EVENTS:
                response = event.get("response")
                rid = response.get("id") if isinstance(response, dict) else None
                if isinstance(rid, str) and rid:
                    return rid
        return ""

    @staticmethod
    def events_usage(events: Iterable[dict[str, Any]]) -> Usage | None:
        found: Usage | None = None
        for event in events:
            usage = event.get("usage")
            if not isinstance(usage, dict) and event.get("type") == "response.completed":
                response = event.get("response")
                usage = response.get("usage") if isinstance(response, dict) else None
            if isinstance(usage, dict):
                # Servers that stream running totals report several blocks; the latest wins.
                if found is None:
                    found = Usage()
                found.merge(openai_usage(usage))
        return found


class AnthropicDialect:
    """Usage extraction for Anthropic Messages responses."""

    counts_events: Final = False
    wants_by_substring: Final = True

    @staticmethod
    def wants(content: bytes) -> bool:
        return content.find(b"usage") >= 0

    @staticmethod
    def body_response_id(obj: Any) -> str:
        return ""  # Messages responses hold no server-side state to continue from

    @staticmethod
    def events_response_id(events: Iterable[dict[str, Any]]) -> str:
        return ""

    @staticmethod
    def body_usage(obj: Any) -> Usage | None:
        usage = obj.get("usage") if isinstance(obj, dict) else None
        if not isinstance(usage, dict):
            return None
        prompt = to_int(usage.get("input_tokens"))
        completion = to_int(usage.get("output_tokens"))
        return Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=to_int(usage.get("cache_read_input_tokens")),
            total_tokens=prompt + completion,
        )

    @staticmethod
    def events_usage(events: Iterable[dict[str, Any]]) -> Usage | None:
        found: Usage | None = None
        started = delta = False
        for event in events:
            kind = event.get("type")
            if kind == "message_start":
                message = event.get("message")
                usage = message.get("usage") if isinstance(message, dict) else None
                if isinstance(usage, dict):
                    found = found or Usage()
                    started = True
                    found.prompt_tokens = to_int(usage.get("input_tokens"))
                    found.cached_tokens = to_int(usage.get("cache_read_input_tokens"))
            elif kind == "message_delta":
                usage = event.get("usage")
                if isinstance(usage, dict):
                    found = found or Usage()
                    delta = True
                    found.completion_tokens = to_int(usage.get("output_tokens"))
        if found is not None and started and delta:
            found.total_tokens = found.prompt_tokens + found.completion_tokens
        return found


_UNFINISHED: Final = (b'"finish_reason":null', b'"finish_reason": null')


def _meta_usage(obj: Any) -> Usage | None:
    meta = obj.get("meta_info") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return None
    if meta.get("prompt_tokens") is None and meta.get("completion_tokens") is None:
        return None
    prompt = to_int(meta.get("prompt_tokens"))
    completion = to_int(meta.get("completion_tokens"))
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=to_int(meta.get("cached_tokens")),
        total_tokens=prompt + completion,
    )


class SGLangDialect:
    """Usage extraction for SGLang ``/generate`` responses (``meta_info``)."""

    counts_events: Final = False
    wants_by_substring: Final = False  # an unfinished event beside a finished one hides it

    @staticmethod
    def wants(content: bytes) -> bool:
        return b'"finish_reason"' in content and not any(m in content for m in _UNFINISHED)

    @staticmethod
    def body_response_id(obj: Any) -> str:
        return ""

    @staticmethod
    def events_response_id(events: Iterable[dict[str, Any]]) -> str:
        return ""

    @staticmethod
    def body_usage(obj: Any) -> Usage | None:
        return _meta_usage(obj)

    @staticmethod
    def events_usage(events: Iterable[dict[str, Any]]) -> Usage | None:
        for event in events:
            meta = event.get("meta_info")
            if isinstance(meta, dict) and meta.get("finish_reason") is not None:
                return _meta_usage(event)
        return None


Dialect = type[OpenAIDialect] | type[AnthropicDialect] | type[SGLangDialect]


def _decode(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _scan_lines(dialect: Dialect, lines: Iterable[bytes]) -> ParsedResponse:
    """Count ``data: `` events and extract usage from complete SSE lines."""
    events = 0
    decoded: list[dict[str, Any]] = []
    for line in lines:
        if not line.startswith(DATA_PREFIX):
            continue
        content = line[len(DATA_PREFIX) :]
        if content.rstrip(b"\r") == DONE:
            continue
        events += 1
        # Cheap substring tests first: most events carry neither usage nor a response id and
        # are never decoded.
        if dialect.wants(content):
            event = _decode(content)
            if isinstance(event, dict):
                decoded.append(event)
    if not decoded:
        return ParsedResponse(streamed_events=events if dialect.counts_events else 0)
    return ParsedResponse(
        usage=dialect.events_usage(decoded),
        streamed_events=events if dialect.counts_events else 0,
        response_id=dialect.events_response_id(decoded),
    )


def _body(dialect: Dialect, body: bytes) -> ParsedResponse:
    obj = _decode(body)
    return ParsedResponse(usage=dialect.body_usage(obj), response_id=dialect.body_response_id(obj))


def _looks_like_json(data: bytes) -> bool | None:
    """True for a JSON body, False for SSE, None while only blanks were seen."""
    match = _FIRST_BYTE.match(data)
    if match is None:
        return None
    return match.group(1) == b"{"


def parse_whole(
    dialect: Dialect, body: bytes, headers: Mapping[str, str] | None = None
) -> ParsedResponse:
    """Usage of a complete response body (buffered response, or a whole SSE transcript)."""
    if not body:
        return ParsedResponse()
    if not is_event_stream(headers) and _looks_like_json(body):
        return _body(dialect, body)
    return _scan_lines(dialect, body.split(b"\n"))


class ResponseUsageState:
    """Incremental usage extraction for one streamed response; see the module docstring.

    Each ``feed`` returns what that chunk contributed (events counted in it, usage blocks completed
    in it); the caller accumulates with ``Usage.merge`` and by summing ``streamed_events``.
    """

    __slots__ = ("_dialect", "_dropping", "_json", "_parts", "_size", "_tail")

    def __init__(self, dialect: Dialect, headers: Mapping[str, str] | None = None) -> None:
        self._dialect = dialect
        self._json: bool | None = False if is_event_stream(headers) else None
        self._tail = b""
        self._dropping = False
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes, end_of_stream: bool) -> ParsedResponse:
        """What ``chunk`` contributed. The result may be shared between calls (the usual token
        chunk's is): read it, never change it."""
        if (
            self._json is False
            and not self._tail
            and not self._dropping
            and chunk.startswith(DATA_PREFIX)
            and chunk.find(b"\n") == len(chunk) - 2
            and chunk[-1] == 10  # b"\n"
            and not self._dialect.wants(chunk)
        ):
            # A streamed answer's usual chunk, one token: a single whole ``data:`` event (its
            # only newlines the two that end it) with neither usage nor a response id. The
            # general path gives the same result; this one is most of a streamed response.
            counted = self._dialect.counts_events and (
                chunk[6] == 123 or chunk[6:-2].rstrip(b"\r") != DONE  # 123: b"{"
            )
            return _ONE_EVENT if counted else _NOTHING
        if self._json is None and chunk:
            self._json = _looks_like_json(chunk)
        if self._json:
            return self._feed_json(chunk, end_of_stream)
        if self._json is None:
            # Only blanks so far: nothing to keep, whatever the format turns out to be.
            return ParsedResponse()
        return self._feed_sse(chunk, end_of_stream)

    def _feed_json(self, chunk: bytes, end_of_stream: bool) -> ParsedResponse:
        if self._size >= 0 and chunk:
            self._size += len(chunk)
            if self._size > MAX_JSON_BODY:
                self._parts.clear()
                self._size = -1  # over the limit: stop buffering for good
            else:
                self._parts.append(chunk)
        if not end_of_stream or self._size < 0:
            return ParsedResponse()
        parts, self._parts = self._parts, []
        if not parts:
            return ParsedResponse()
        return _body(self._dialect, parts[0] if len(parts) == 1 else b"".join(parts))

    def _feed_sse(self, chunk: bytes, end_of_stream: bool) -> ParsedResponse:
        dropped_events = 0
        if self._dropping:
            # The start of the current line was discarded; skip to its end.
            cut = chunk.find(b"\n")
            if cut < 0:
                return ParsedResponse()
            chunk = chunk[cut + 1 :]
            self._dropping = False
        data = self._tail + chunk if self._tail else chunk
        dialect = self._dialect
        if dialect.wants_by_substring and data.find(DONE) < 0 and not dialect.wants(data):
            # No line carries usage, a response id or the end marker (several tokens, or a
            # Responses API event and its type, in one chunk): count the complete ``data:``
            # lines without splitting them; the general path below gives the same result.
            cut = len(data) if end_of_stream else data.rfind(b"\n") + 1
            if len(data) - cut <= MAX_SSE_LINE:
                self._tail = data[cut:]
                if not dialect.counts_events:
                    return _NOTHING
                events = data.count(b"\n" + DATA_PREFIX, 0, cut)
                events += data.startswith(DATA_PREFIX, 0, cut)
                if events < 2:
                    return _ONE_EVENT if events else _NOTHING
                return ParsedResponse(streamed_events=events)
        lines = data.split(b"\n")
        self._tail = b"" if end_of_stream else lines.pop()
        if len(self._tail) > MAX_SSE_LINE:
            # Still count the event the oversized line started, so the total stays right.
            if self._tail.startswith(DATA_PREFIX) and self._dialect.counts_events:
                dropped_events = 1
            self._tail = b""
            self._dropping = True
        parsed = _scan_lines(self._dialect, lines)
        parsed.streamed_events += dropped_events
        return parsed


class NullResponseState:
    """Response state of parsers that extract nothing (passthrough, skipped responses)."""

    __slots__ = ()

    def feed(self, chunk: bytes, end_of_stream: bool) -> ParsedResponse:
        return ParsedResponse()
