from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from epp.plugin import Discovery, Endpoint
from epp.plugin.params import ParamError, decode
from epp.plugins.sources.file_discovery import (
    MAX_FILE_BYTES,
    EndpointsFileError,
    FileDiscovery,
    dump_endpoints,
    load_endpoints,
    parse_endpoints,
)
from tests.builders import handle

VALID_YAML = """
endpoints:
- name: vllm-0
  address: 10.0.0.1
  port: "8000"
  labels:
    llm-d.ai/engine-type: vllm
- name: vllm-1
  namespace: team-a
  address: 10.0.0.2
  port: 8001
- name: v6
  address: "fd00::1"
  port: 9000
"""


def _write(tmp_path: Path, text: str, name: str = "endpoints.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_load_endpoints_builds_endpoints_when_yaml_is_valid(tmp_path: Path) -> None:
    endpoints = load_endpoints(_write(tmp_path, VALID_YAML))
    assert endpoints == [
        Endpoint(
            id="default/vllm-0",
            name="vllm-0",
            namespace="default",
            address="10.0.0.1",
            port=8000,
            rank=0,
            labels={"llm-d.ai/engine-type": "vllm"},
        ),
        Endpoint(
            id="team-a/vllm-1", name="vllm-1", namespace="team-a", address="10.0.0.2", port=8001
        ),
        Endpoint(id="default/v6", name="v6", namespace="default", address="fd00::1", port=9000),
    ]
    assert endpoints[2].hostport == "[fd00::1]:9000"


def test_load_endpoints_reads_json_when_file_is_json(tmp_path: Path) -> None:
    document = {"endpoints": [{"name": "a", "address": "192.168.0.9", "port": "80"}]}
    path = _write(tmp_path, json.dumps(document), "endpoints.json")
    assert [(e.id, e.hostport) for e in load_endpoints(path)] == [("default/a", "192.168.0.9:80")]


@pytest.mark.parametrize(
    "text",
    [pytest.param("endpoints: []", id="empty-list"), pytest.param("endpoints:", id="null-list")],
)
def test_load_endpoints_returns_empty_set_when_list_is_empty(tmp_path: Path, text: str) -> None:
    assert load_endpoints(_write(tmp_path, text)) == []


def _entry(**overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": "a", "address": "10.0.0.1", "port": "8000"}
    entry.update(overrides)
    return {k: v for k, v in entry.items() if v is not None}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        pytest.param({"endpoints": [_entry(address="vllm.local")]}, "not an IP", id="hostname"),
        pytest.param({"endpoints": [_entry(address="10.0.0.300")]}, "not an IP", id="bad-ip"),
        pytest.param({"endpoints": [_entry(port="0")]}, "out of range", id="port-zero"),
        pytest.param({"endpoints": [_entry(port=70000)]}, "out of range", id="port-high"),
        pytest.param({"endpoints": [_entry(port="http")]}, "invalid port", id="port-word"),
        pytest.param({"endpoints": [_entry(port=True)]}, "port must be", id="port-bool"),
        pytest.param({"endpoints": [_entry(name="")]}, "'name' must be", id="empty-name"),
        pytest.param({"endpoints": [_entry(name=None)]}, "'name' must be", id="missing-name"),
        pytest.param({"endpoints": [_entry(address=None)]}, "'address' must", id="no-address"),
        pytest.param({"endpoints": [_entry(port=None)]}, "invalid port", id="missing-port"),
        pytest.param({"endpoints": [_entry(labels={"a": 1})]}, "labels must", id="label-int"),
        pytest.param({"endpoints": [_entry(metricsHost="x")]}, "unknown field", id="unknown"),
        pytest.param({"endpoints": [_entry(), _entry()]}, "duplicate name", id="duplicate"),
        pytest.param({"endpoints": ["a"]}, "must be a mapping", id="entry-not-mapping"),
        pytest.param({"endpoints": {"a": 1}}, "must be a list", id="not-a-list"),
        pytest.param({"pods": []}, "'endpoints' list", id="no-endpoints-key"),
        pytest.param([1, 2], "'endpoints' list", id="not-a-mapping"),
    ],
)
def test_load_endpoints_raises_when_file_is_invalid(
    tmp_path: Path, document: Any, message: str
) -> None:
    with pytest.raises(EndpointsFileError, match=message):
        load_endpoints(_write(tmp_path, json.dumps(document)))


def test_load_endpoints_allows_same_name_when_namespaces_differ(tmp_path: Path) -> None:
    document = {"endpoints": [_entry(), _entry(namespace="other", address="10.0.0.2")]}
    ids = [e.id for e in load_endpoints(_write(tmp_path, json.dumps(document)))]
    assert ids == ["default/a", "other/a"]


def test_rank_entries_keep_their_names_and_ports_when_one_pod_has_several_ranks() -> None:
    # Upstream's file discovery: id <namespace>/<name>, rank index 0, the port as written.
    text = dump_endpoints(
        [("vllm-0-rank-0", "10.0.0.1", 8000), ("vllm-0-rank-1", "10.0.0.1", 8001)],
        labels={"vllm-0-rank-1": {"llm-d.ai/role": "decode"}},
    )
    endpoints = parse_endpoints(text.encode())
    assert [(e.id, e.hostport, e.rank) for e in endpoints] == [
        ("default/vllm-0-rank-0", "10.0.0.1:8000", 0),
        ("default/vllm-0-rank-1", "10.0.0.1:8001", 0),
    ]
    assert [dict(e.labels) for e in endpoints] == [{}, {"llm-d.ai/role": "decode"}]


def test_load_endpoints_raises_when_yaml_is_malformed(tmp_path: Path) -> None:
    with pytest.raises(EndpointsFileError, match="not valid YAML"):
        load_endpoints(_write(tmp_path, "endpoints: [\n  - name: a\n"))


def test_load_endpoints_raises_when_file_is_missing(tmp_path: Path) -> None:
    with pytest.raises(EndpointsFileError, match="cannot read"):
        load_endpoints(str(tmp_path / "absent.yaml"))


def test_load_endpoints_raises_when_file_exceeds_one_mebibyte(tmp_path: Path) -> None:
    padding = "#" * (MAX_FILE_BYTES + 1)
    with pytest.raises(EndpointsFileError, match="1 MiB"):
        load_endpoints(_write(tmp_path, f"endpoints: []\n{padding}\n"))


@pytest.mark.parametrize(
    ("params", "path", "problem"),
    [
        pytest.param({}, "", "path", id="missing-path"),
        pytest.param({"path": "/x", "pollInterval": "0s"}, "", "positive", id="zero-interval"),
        pytest.param({"path": "/x", "pollInterval": "soon"}, "", "invalid duration", id="bad"),
        pytest.param({"path": "/x", "watch": True}, "watch", "unknown field", id="unknown"),
    ],
)
def test_params_decode_fails_when_parameters_are_invalid(
    params: dict[str, Any], path: str, problem: str
) -> None:
    with pytest.raises(ParamError) as info:
        decode(FileDiscovery.Params, params)
    assert info.value.path.endswith(path)
    assert problem in str(info.value)


class _Published:
    """Records every set the discovery publishes."""

    def __init__(self) -> None:
        self.sets: list[list[str]] = []
        self.changed = asyncio.Event()

    def __call__(self, endpoints: Sequence[Endpoint]) -> None:
        self.sets.append([e.id for e in endpoints])
        self.changed.set()

    async def wait_for(self, count: int, timeout: float = 3.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.sets) < count:
                self.changed.clear()
                await self.changed.wait()


def _discovery(path: str, **params: Any) -> FileDiscovery:
    decoded = decode(FileDiscovery.Params, {"path": path, **params})
    return FileDiscovery(name="", params=decoded, handle=handle())


def _doc(*names: str) -> str:
    entries = [_entry(name=n, address=f"10.0.0.{i + 1}") for i, n in enumerate(names)]
    return json.dumps({"endpoints": entries})


async def test_run_publishes_file_once_when_watch_is_off(tmp_path: Path) -> None:
    path = _write(tmp_path, _doc("a", "b"))
    published = _Published()
    task = asyncio.create_task(_discovery(path, pollInterval="10ms").run(published))
    await published.wait_for(1)
    Path(path).write_text(_doc("c"))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert published.sets == [["default/a", "default/b"]]


async def test_run_raises_when_file_is_broken_at_start(tmp_path: Path) -> None:
    path = _write(tmp_path, "endpoints: [{name: a, address: nowhere, port: 1}]")
    published = _Published()
    with pytest.raises(EndpointsFileError, match="not an IP"):
        await asyncio.wait_for(_discovery(path).run(published), 3.0)
    assert published.sets == []


async def test_run_republishes_when_watched_file_changes(tmp_path: Path) -> None:
    path = _write(tmp_path, _doc("a"))
    published = _Published()
    task = asyncio.create_task(_discovery(path, watchFile=True, pollInterval="10ms").run(published))
    try:
        await published.wait_for(1)
        Path(path).write_text(_doc("a", "b", "c"))
        await published.wait_for(2)
        # A rewrite with identical content is not a change.
        Path(path).write_text(_doc("a", "b", "c"))
        await asyncio.sleep(0.1)
        assert published.sets == [["default/a"], ["default/a", "default/b", "default/c"]]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_run_keeps_previous_set_when_reloaded_file_is_broken(tmp_path: Path) -> None:
    path = _write(tmp_path, _doc("a"))
    published = _Published()
    task = asyncio.create_task(_discovery(path, watchFile=True, pollInterval="10ms").run(published))
    try:
        await published.wait_for(1)
        Path(path).write_text("endpoints: [{name: a, address: nowhere, port: 1}]")
        await asyncio.sleep(0.1)
        Path(path).unlink()
        await asyncio.sleep(0.1)
        assert published.sets == [["default/a"]]
        assert not task.done()
        Path(path).write_text(_doc("b"))
        await published.wait_for(2)
        assert published.sets[-1] == ["default/b"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_file_discovery_fills_discovery_role_when_checked_at_runtime(tmp_path: Path) -> None:
    discovery = _discovery(_write(tmp_path, _doc("a")))
    assert isinstance(discovery, Discovery)
    assert discovery.typed_name.type == "file-discovery"
