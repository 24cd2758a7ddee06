"""What the supervisor and a worker tell each other."""

from __future__ import annotations

import json

import pytest

from epp.settings import Settings
from epp.workers.spec import WorkerReport, decode_settings, encode_settings


def test_settings_survive_the_trip_to_a_worker() -> None:
    s = Settings(
        grpc_port=1234,
        endpoint_selector="app=x",
        endpoint_target_ports=(8000, 8001),
        objectives_files=("a.yaml", "b.yaml"),
        config_text="apiVersion: x\n",
        seed=None,
        workers=1,
        drain_timeout=1.5,
    )
    assert decode_settings(encode_settings(s)) == s


def test_an_unknown_settings_field_is_refused() -> None:
    raw = json.loads(encode_settings(Settings()))
    raw["surprise"] = 1
    with pytest.raises(ValueError, match="unknown fields \\['surprise'\\]"):
        decode_settings(json.dumps(raw))
    with pytest.raises(ValueError, match="JSON object"):
        decode_settings("[]")


def test_a_report_is_one_json_line() -> None:
    report = WorkerReport(pid=10, grpc_port=1, health_port=2, metrics_port=3)
    line = report.encode()
    assert line.endswith("\n") and line.count("\n") == 1
    assert WorkerReport.decode(line) == report
    with pytest.raises(KeyError, match="grpc_port"):
        WorkerReport.decode('{"pid": 1}')
