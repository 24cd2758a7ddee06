"""Log lines as upstream's zap logger writes them (controller-runtime's ``--zap-*`` flags and
``-v``), rendered by structlog from the standard ``logging`` records the code emits.

Every module logs through ``logging`` and passes values as fields, not in the message:
``log.warning("data producer failed", extra={"plugin": name, "request_id": rid})``. A plugin's
logger (``Handle.logger``, named ``epp.plugin.<type>/<name>``) adds ``plugin`` by itself.

Encoders (``--zap-encoder``):

- ``json``: one JSON object per line, ``level``, ``ts``, ``logger``, ``caller``, ``msg``, the
  fields, then ``error`` and ``stacktrace`` when there are some. Whatever a message or a field
  holds (quotes, newlines, bytes that are not UTF-8, objects), the line is valid JSON and pure
  ASCII; a record whose message cannot be formatted is still written (``msg`` is the raw format
  string, ``args`` its arguments) instead of breaking the stream.
- ``console``: for people, ``<ts> <level> <logger> <msg> key=value ...``.

Flags, with upstream's semantics:

- ``--zap-devel`` (default true, as upstream): development defaults, the console encoder;
  ``--zap-devel=false``: production defaults, JSON.
- ``--zap-log-level``: ``debug``, ``info``, ``warn``, ``error``, ``dpanic``, ``panic``,
  ``fatal``, or an integer n > 0 (logr's ``V(n)`` lines and below). When absent, ``-v`` decides
  (default 2): 3 adds verbose lines, 4 debug lines, 5 trace lines. One deliberate difference:
  ``debug`` shows the debug lines (``V(4)``); in zap it is ``V(1)``, which hides them.
- ``--zap-stacktrace-level``: lines at this level or above carry ``stacktrace``. Deliberate
  difference: the default is ``error`` in both modes; zap's development mode traces from
  ``warn``, which printed a Python stack under every expected warning (metrics auth off, a
  plugin's clamped parameter). ``--zap-stacktrace-level=warn`` asks for those traces.
- ``--zap-time-encoding``: ``rfc3339`` (default, as controller-runtime), ``rfc3339nano``,
  ``iso8601`` (all with the zone offset), ``epoch`` (seconds), ``millis``, ``nano``.

Level names are zap's, with upstream's encoder for verbose levels: ``V(1..3)`` lines say
``info``, ``V(4)`` ``debug``, ``V(5)`` and beyond ``trace``; Python's ``CRITICAL`` is ``fatal``.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import traceback
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import IO, Any, Final

import structlog

from epp.observability.decisions import loggable

TRACE: Final = 5
"""Python level of logr ``V(5)`` (trace) lines; ``V(4)`` is ``logging.DEBUG``."""

ZAP_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "dpanic": logging.CRITICAL,
    "panic": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}
TIME_ENCODINGS: Final = ("rfc3339", "rfc3339nano", "iso8601", "epoch", "millis", "nano")
ENCODERS: Final = ("json", "console")
_STD_KEYS: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


def fields(request: Any = None, plugin: Any = None, **more: Any) -> dict[str, Any]:
    """The ``extra`` of a log call: ``request_id`` of ``request``, ``plugin`` (its typed name)
    and ``more``, e.g. ``log.warning("hook failed", extra=fields(request, hook))``."""
    out: dict[str, Any] = {} if request is None else {"request_id": loggable(request.request_id)}
    if plugin is not None:
        out["plugin"] = str(plugin.typed_name)
    return {**out, **more}


def verbosity_level(v: int) -> int:
    """The Python level threshold of logr verbosity ``v`` (``V(n)`` lines with n <= v)."""
    if v >= 5:
        return TRACE
    if v == 4:
        return logging.DEBUG
    return logging.INFO - max(v, 0)


def level_name(levelno: int) -> str:
    if levelno >= logging.CRITICAL:
        return "fatal"
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warn"
    if levelno > logging.DEBUG:
        return "info"
    return "debug" if levelno > TRACE else "trace"


def _zap_level(text: str, flag: str) -> int:
    value = text.strip().lower()
    if value in ZAP_LEVELS:
        return ZAP_LEVELS[value]
    if value.isdigit() and int(value) > 0:
        return verbosity_level(int(value))
    raise ValueError(f"--{flag}: {text!r} is not one of {', '.join(ZAP_LEVELS)} or an integer > 0")


@dataclass(frozen=True)
class LogConfig:
    level: int = logging.INFO
    json: bool = False
    stacktrace_level: int = logging.ERROR
    time_encoding: str = "rfc3339"
    worker: int | None = None


def log_config(
    *,
    verbosity: int = 2,
    zap_devel: bool = True,
    zap_encoder: str = "",
    zap_log_level: str = "",
    zap_stacktrace_level: str = "",
    zap_time_encoding: str = "",
) -> LogConfig:
    """The logging the flags ask for; ``ValueError`` names a flag with a bad value."""
    if zap_encoder not in ("", *ENCODERS):
        raise ValueError(f"--zap-encoder: {zap_encoder!r} is not one of {', '.join(ENCODERS)}")
    if zap_time_encoding not in ("", *TIME_ENCODINGS):
        raise ValueError(
            f"--zap-time-encoding: {zap_time_encoding!r} is not one of {', '.join(TIME_ENCODINGS)}"
        )
    level = (
        _zap_level(zap_log_level, "zap-log-level") if zap_log_level else verbosity_level(verbosity)
    )
    stack = (
        _zap_level(zap_stacktrace_level, "zap-stacktrace-level")
        if zap_stacktrace_level
        else logging.ERROR  # zap's devel mode says warn: a warning is expected, not a fault
    )
    return LogConfig(
        level=level,
        json=(zap_encoder or ("console" if zap_devel else "json")) == "json",
        stacktrace_level=stack,
        time_encoding=zap_time_encoding or "rfc3339",
    )


def format_time(created: float, encoding: str) -> float | int | str:
    if encoding == "epoch":
        return created
    if encoding == "millis":
        return created * 1000.0
    if encoding == "nano":
        return int(created * 1e9)
    moment = datetime.datetime.fromtimestamp(created).astimezone()
    if encoding == "rfc3339":
        return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
    if encoding == "rfc3339nano":
        return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")
    text = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
    return text + moment.strftime("%z").replace("+0000", "Z")  # iso8601, zap's layout


def _clean(value: Any) -> Any:
    """Strings that encode: lone surrogates (bytes that were not UTF-8) become escapes."""
    if isinstance(value, str) and not value.isascii():
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return value


def _stack() -> str:
    skip = (logging.__file__, __file__)
    frames = [
        f
        for f in traceback.extract_stack()
        if f.filename not in skip and f"{os.sep}structlog{os.sep}" not in f.filename
    ]
    return "".join(traceback.format_list(frames[-12:]))


class _Fields:
    """structlog processor: the zap fields of a standard ``logging`` record, in zap's order."""

    def __init__(self, config: LogConfig) -> None:
        self.config = config

    def __call__(
        self, logger: Any, method: str, event: MutableMapping[str, Any]
    ) -> Mapping[str, Any]:
        record: logging.LogRecord = event["_record"]
        out: dict[str, Any] = {
            "level": level_name(record.levelno),
            "ts": format_time(record.created, self.config.time_encoding),
            "logger": record.name,
            "caller": f"{record.filename}:{record.lineno}",
            "msg": _clean(event.get("event", "")),
        }
        if self.config.worker is not None:
            out["worker"] = self.config.worker
        if record.name.startswith("epp.plugin."):
            out["plugin"] = record.name[len("epp.plugin.") :]
        for key, value in vars(record).items():
            if key not in _STD_KEYS and not key.startswith("_"):
                out[_clean(key)] = _clean(value)
        if record.exc_info and record.exc_info[1] is not None:
            out["error"] = _clean(repr(record.exc_info[1]))
            out["stacktrace"] = _clean("".join(traceback.format_exception(*record.exc_info)))
        elif record.levelno >= self.config.stacktrace_level:
            out["stacktrace"] = _clean(record.stack_info or _stack())
        out["_record"] = record
        out["_from_structlog"] = False
        return out


def _console(logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
    fields = " ".join(
        f"{k}={v!r}" if isinstance(v, str) and (not v or " " in v or "\n" in v) else f"{k}={v}"
        for k, v in event.items()
        if k not in ("level", "ts", "logger", "caller", "msg", "stacktrace")
    )
    line = f"{event['ts']} {event['level']:<5} {event['logger']} {event['msg']}"
    line = f"{line} {fields}" if fields else line
    stack = event.get("stacktrace")
    return f"{line}\n{stack.rstrip()}" if stack else line


def _dumps(obj: Any, **kw: Any) -> str:
    return json.dumps(
        obj, ensure_ascii=True, separators=(",", ":"), default=lambda v: _clean(repr(v))
    )


class ZapFormatter(structlog.stdlib.ProcessorFormatter):
    """Renders records as zap lines; never raises (a broken record is still one line)."""

    def __init__(self, config: LogConfig) -> None:
        renderer: Any = (
            structlog.processors.JSONRenderer(serializer=_dumps) if config.json else _console
        )
        super().__init__(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[_Fields(config)],
        )

    def format(self, record: logging.LogRecord) -> str:
        try:
            return super().format(record)
        except Exception:  # a message that does not format: keep its raw parts
            safe = logging.makeLogRecord(
                {**vars(record), "msg": _clean(str(record.msg)), "args": None}
            )
            safe.__dict__["args_repr"] = _clean(repr(record.args))
            return super().format(safe)


def configure(config: LogConfig, stream: IO[str] | None = None) -> logging.Handler:
    """Route every ``logging`` record at ``config.level`` or above to ``stream`` (stderr) as
    zap lines, replacing the root logger's handlers. Returns the handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(ZapFormatter(config))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(config.level)
    logging.addLevelName(TRACE, "TRACE")
    return handler
