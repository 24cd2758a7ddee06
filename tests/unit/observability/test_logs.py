"""Log lines (``epp.observability.logs``) through the logger the command line configures."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.cli import settings_from_args, setup_logging
from epp.observability.logs import TRACE, format_time

EPP = str(Path(sys.executable).parent / "epp")
PORTS = ("--secure-serving=false", "--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0")
ZONED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)$")


@pytest.fixture
def capture() -> Iterator[io.StringIO]:
    """Point the configured handler at a buffer; restore the root logger afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    buf = io.StringIO()
    yield buf
    root.handlers[:] = handlers
    root.setLevel(level)


def configured(buf: io.StringIO, *argv: str) -> None:
    setup_logging(settings_from_args(list(argv)))
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(buf)


def lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


messages = st.one_of(
    st.text(),
    st.binary().map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.binary(),
    st.text(alphabet='%s%d%(x)s"\\\n\r\t{}', max_size=20),
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(message=messages, value=messages, args=st.lists(messages, max_size=2))
def test_every_line_is_json_when_messages_and_fields_are_fuzzed(
    capture: io.StringIO, message: object, value: object, args: list[object]
) -> None:
    capture.seek(0)
    capture.truncate()
    configured(capture, "--zap-encoder=json")
    log = logging.getLogger("epp.plugin.fuzz/one")
    log.warning(message, *args, extra={"endpoint": value, "request_id": "r-1"})
    try:
        raise ValueError(message)
    except ValueError:
        log.exception("failed", extra={'odd key\n"': value})
    text = capture.getvalue()
    assert text.isascii()
    warn, failed = (json.loads(line) for line in text.splitlines())
    assert (warn["level"], warn["plugin"], warn["request_id"]) == ("warn", "fuzz/one", "r-1")
    assert ZONED.match(str(warn["ts"]))
    if isinstance(message, str) and not args and message.isascii() and "%" not in message:
        assert warn["msg"] == message
    assert failed["level"] == "error" and "ValueError" in str(failed["stacktrace"])


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        pytest.param([], {"info", "warn", "error"}, id="default-v2"),
        pytest.param(["-v", "3"], {"verbose", "info", "warn", "error"}, id="v3"),
        pytest.param(["-v", "4"], {"debug", "verbose", "info", "warn", "error"}, id="v4"),
        pytest.param(["-v=5"], {"trace", "debug", "verbose", "info", "warn", "error"}, id="v5"),
        pytest.param(
            ["--zap-log-level=debug"], {"debug", "verbose", "info", "warn", "error"}, id="debug"
        ),
        pytest.param(
            ["--zap-log-level=4", "-v", "1"],
            {"debug", "verbose", "info", "warn", "error"},
            id="int",
        ),
        pytest.param(["--zap-log-level=error", "-v", "5"], {"error"}, id="error"),
    ],
)
def test_levels_follow_v_and_zap_log_level_when_set(
    capture: io.StringIO, argv: list[str], shown: set[str]
) -> None:
    configured(capture, "--zap-encoder=json", *argv)
    log = logging.getLogger("epp.test")
    levels = {"trace": TRACE, "debug": logging.DEBUG, "verbose": logging.INFO - 3}
    levels |= {"info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}
    for name, level in levels.items():
        log.log(level, name)
    got = lines(capture)
    assert {line["msg"] for line in got} == shown
    names = {line["msg"]: line["level"] for line in got}
    assert names.get("verbose", "info") == "info"  # upstream's encoder: V(1..3) say info
    assert names.get("trace", "trace") == "trace"


def test_production_defaults_are_json_with_stacks_from_error_when_not_devel(
    capture: io.StringIO,
) -> None:
    configured(capture, "--zap-devel=false", "--zap-time-encoding=epoch")
    log = logging.getLogger("epp.test")
    log.warning("w")
    log.error("e")
    warn, error = lines(capture)
    assert "stacktrace" not in warn and "test_logs.py" in str(error["stacktrace"])
    assert isinstance(warn["ts"], float)


def test_a_warning_has_no_stack_trace_unless_asked_while_an_error_keeps_it(
    capture: io.StringIO,
) -> None:
    """The console default (--zap-devel): an expected warning is one line; an error still
    carries its stack, and --zap-stacktrace-level=warn brings the warnings' back."""
    configured(capture)
    log = logging.getLogger("epp.test")
    log.warning("metrics auth is off")
    warning = capture.getvalue()
    assert re.match(r"^\S+ warn  epp.test metrics auth is off\n$", warning), warning
    log.error("failed")
    assert "test_logs.py" in capture.getvalue()[len(warning) :]
    asked = io.StringIO()
    configured(asked, "--zap-stacktrace-level=warn")
    log.warning("metrics auth is off")
    assert "test_logs.py" in asked.getvalue()


def test_console_is_for_people_with_fields_as_key_values_when_devel(capture: io.StringIO) -> None:
    configured(capture, "--zap-stacktrace-level=error")
    logging.getLogger("epp.test").info("routed", extra={"endpoint": "default/pod-0"})
    line = capture.getvalue()
    assert re.match(r"^\S+ info  epp.test routed endpoint=default/pod-0\n$", line), line


@pytest.mark.parametrize(
    ("encoding", "pattern"),
    [
        ("rfc3339", r"^2024-01-02T03:04:05(Z|[+-]\d\d:\d\d)$"),
        ("rfc3339nano", r"^2024-01-02T03:04:05\.250000(Z|[+-]\d\d:\d\d)$"),
        ("iso8601", r"^2024-01-02T03:04:05\.250(Z|[+-]\d{4})$"),
    ],
)
def test_time_encodings_carry_the_zone_when_textual(encoding: str, pattern: str) -> None:
    import datetime

    local = datetime.datetime(2024, 1, 2, 3, 4, 5, 250000).astimezone()
    assert re.match(pattern, str(format_time(local.timestamp(), encoding)))


@pytest.mark.parametrize(
    "flag", ["--zap-log-level=loud", "--zap-encoder=xml", "--zap-time-encoding=unix"]
)
def test_bad_zap_values_are_refused_when_parsed(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        settings_from_args([flag])
    assert exited.value.code == 2
    assert flag.split("=")[0] in capsys.readouterr().err


def test_every_epp_line_is_json_when_the_endpoints_file_is_broken(tmp_path: Path) -> None:
    endpoints = tmp_path / 'eps "quoted"\nnewline.yaml'
    endpoints.write_bytes(b'endpoints:\n- {name: "a\\"b\n  bad: \xff\xfe')
    config = f"""apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: file-discovery
  parameters: {{path: {json.dumps(str(endpoints))}}}
dataLayer:
  discovery: {{pluginRef: file-discovery}}
"""
    out = subprocess.run(
        [EPP, "--config-text", config, "--zap-encoder=json", "--zap-log-level=debug", *PORTS],
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 2
    got = [json.loads(line) for line in out.stderr.decode("ascii").splitlines()]
    assert any(line["level"] == "debug" for line in got), got
    (failed,) = [line for line in got if line["msg"] == "start-up failed"]
    assert "newline.yaml" in str(failed["reason"])
