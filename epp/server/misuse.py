"""Protocol misuse on an ext_proc stream: the error a stream ends with, and its rate-limited log.

A ``ProtocolError`` is raised by ``RequestStream`` (or the servicer, for bytes that do not decode)
when the data plane sends a message the Endpoint Picker Protocol does not allow where it came. The
servicer ends the stream with gRPC status ``INVALID_ARGUMENT`` and ``message`` as the details,
counts it in ``llm_d_epp_extproc_protocol_errors_total{reason}`` and logs it at WARNING, each
reason at most once every 30 s (with the number of occurrences in between). ``reason`` is one of
the fixed values of ``REASONS``, so the metric has a bounded label set:

============================================  ==============================
message                                       reason
============================================  ==============================
bytes that do not decode as ProcessingRequest ``undecodable``
none of the six ``request`` fields set        ``no_request``
``request_headers`` a second time             ``request_headers_repeated``
``request_body`` before ``request_headers``   ``request_body_before_headers``
``request_body`` after the body ended (EOS,   ``request_body_after_end``
trailers, header-only, or decided)
``request_trailers`` before headers           ``request_trailers_before_headers``
``request_trailers`` after the request ended  ``request_trailers_after_end``
a response message before the request was     ``response_before_request``
answered
``response_headers`` a second time, or after  ``response_headers_repeated``
response body
response body or trailers after the response  ``response_after_end``
ended
``protocol_config`` on a message other than   ``protocol_config_not_first``
the first
============================================  ==============================

Why a gRPC error and not an ImmediateResponse: these are faults of the data plane (a
misconfigured processing mode, a proxy bug, a foreign client), not of the HTTP client, and they
can arrive in the response phase. On a gRPC error Envoy applies the operator's failure mode:
``failure_mode_allow: true`` lets the request or the response go on without the EPP (in the
response phase the client still gets the model server's answer), fail-closed answers 500. An
ImmediateResponse would override that choice and, once the response has started, cut it off.
What the *client* got wrong (a body over the limit, JSON that does not parse, no model) is still
an ImmediateResponse with its HTTP status (413, 400, …).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

UNDECODABLE: Final = "undecodable"
NO_REQUEST: Final = "no_request"
REQUEST_HEADERS_REPEATED: Final = "request_headers_repeated"
BODY_BEFORE_HEADERS: Final = "request_body_before_headers"
BODY_AFTER_END: Final = "request_body_after_end"
TRAILERS_BEFORE_HEADERS: Final = "request_trailers_before_headers"
TRAILERS_AFTER_END: Final = "request_trailers_after_end"
RESPONSE_BEFORE_REQUEST: Final = "response_before_request"
RESPONSE_HEADERS_REPEATED: Final = "response_headers_repeated"
RESPONSE_AFTER_END: Final = "response_after_end"
PROTOCOL_CONFIG_NOT_FIRST: Final = "protocol_config_not_first"

REASONS: Final = (
    UNDECODABLE,
    NO_REQUEST,
    REQUEST_HEADERS_REPEATED,
    BODY_BEFORE_HEADERS,
    BODY_AFTER_END,
    TRAILERS_BEFORE_HEADERS,
    TRAILERS_AFTER_END,
    RESPONSE_BEFORE_REQUEST,
    RESPONSE_HEADERS_REPEATED,
    RESPONSE_AFTER_END,
    PROTOCOL_CONFIG_NOT_FIRST,
)

LOG_EVERY_S: Final = 30.0


class ProtocolError(Exception):
    """The data plane broke the ext_proc protocol; the stream ends with INVALID_ARGUMENT."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class MisuseLog:
    """Logs each reason at most once every ``LOG_EVERY_S`` seconds, with the count since."""

    def __init__(self, log: logging.Logger, clock: Callable[[], float]) -> None:
        self._log = log
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, err: ProtocolError) -> None:
        now = self._clock()
        last = self._last.get(err.reason)
        if last is not None and now - last < LOG_EVERY_S:
            self._suppressed[err.reason] = self._suppressed.get(err.reason, 0) + 1
            return
        self._last[err.reason] = now  # keys are the fixed REASONS: bounded
        more = self._suppressed.pop(err.reason, 0)
        self._log.warning(
            "ext_proc protocol error (%s), stream ended with INVALID_ARGUMENT: %s%s",
            err.reason,
            err.message,
            f" ({more} more since the last report)" if more else "",
        )
