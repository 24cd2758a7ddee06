"""``file-discovery``: the endpoint set from a YAML or JSON file.

File schema (at most 1 MiB)::

    endpoints:
    - name: vllm-0              # required, unique per namespace
      namespace: default        # optional, default "default"
      address: 10.0.0.1         # required, an IP address (no host names)
      port: "8000"              # required, 1..65535, string or integer
      labels:                   # optional, string to string
        llm-d.ai/engine-type: vllm

Each entry is one endpoint with id ``<namespace>/<name>`` and rank 0, as upstream's file
discovery. Data-parallel ranks of one pod are one entry each (same address, the rank's port),
conventionally named as Kubernetes discovery names them (``vllm-0-rank-1``). An empty list is a
valid (empty) set; a file without the ``endpoints`` key, with unknown keys or with an invalid entry
is rejected as a whole.

``run`` loads the file and publishes it; a broken file at start raises (startup error). With
``watchFile: true`` the file is checked every ``pollInterval`` (our addition, default ``1s``):
when its mtime, size or inode changed and its content hash differs from the last one read, it is
reloaded and published. A broken file on reload is logged once and the previous set stays.

YAML example::

    - type: file-discovery
      parameters:
        path: /etc/epp/endpoints.yaml
        watchFile: true
        pollInterval: 500ms
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import yaml

from epp.plugin import Endpoint, Handle, PluginBase, PluginError
from epp.plugin.units import parse_duration

MAX_FILE_BYTES: Final = 1 << 20
DEFAULT_NAMESPACE: Final = "default"
_ENTRY_KEYS: Final = frozenset({"name", "namespace", "address", "port", "labels"})
_Loader: Final = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_HOST_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class EndpointsFileError(PluginError, ValueError):
    """The endpoints file cannot be used; the message names the file and the problem. At start
    it stops the EPP (a ``PluginError``: one line, no traceback)."""


def dump_endpoints(
    entries: Iterable[tuple[str, str, int]],
    namespace: str = "default",
    labels: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """A file-discovery document (YAML) for ``(name, address, port)`` entries; ``labels`` maps an
    entry's name to its labels (entries not in it have none)."""
    out: list[dict[str, Any]] = []
    for name, address, port in entries:
        entry: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "address": address,
            "port": str(port),
        }
        if labels and labels.get(name):
            entry["labels"] = dict(labels[name])
        out.append(entry)
    return yaml.safe_dump({"endpoints": out})


def load_endpoints(path: str) -> list[Endpoint]:
    """Read and validate an endpoints file."""
    return parse_endpoints(_read(path), path)


def parse_endpoints(data: bytes, path: str = "<memory>", *, hosts: bool = False) -> list[Endpoint]:
    """Validate the content of an endpoints file (``path`` only names it in errors). ``hosts``:
    an address may also be a host name (``multicluster-file-discovery``'s cluster gateways)."""
    try:
        document = yaml.load(data, Loader=_Loader)  # _Loader is a safe loader
    except yaml.YAMLError as exc:
        raise EndpointsFileError(f"{path}: not valid YAML/JSON: {exc}") from None
    if not isinstance(document, Mapping) or "endpoints" not in document:
        raise EndpointsFileError(f"{path}: expected a mapping with an 'endpoints' list")
    entries = document["endpoints"]
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise EndpointsFileError(f"{path}: 'endpoints' must be a list")
    endpoints: list[Endpoint] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        try:
            endpoint = _endpoint(entry, hosts)
        except ValueError as exc:
            raise EndpointsFileError(f"{path}: endpoints[{index}]: {exc}") from None
        if endpoint.id in seen:
            raise EndpointsFileError(f"{path}: endpoints[{index}]: duplicate name {endpoint.id!r}")
        seen.add(endpoint.id)
        endpoints.append(endpoint)
    return endpoints


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise EndpointsFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise EndpointsFileError(f"{path}: larger than the 1 MiB limit")
    return data


def _endpoint(entry: Any, hosts: bool) -> Endpoint:
    if not isinstance(entry, Mapping):
        raise ValueError("each endpoint must be a mapping")
    unknown = sorted(str(k) for k in entry if k not in _ENTRY_KEYS)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} (known: {', '.join(sorted(_ENTRY_KEYS))})")
    name = _string(entry, "name", required=True)
    namespace = _string(entry, "namespace", required=False) or DEFAULT_NAMESPACE
    address = _string(entry, "address", required=True)
    if not (is_ip(address) or (hosts and is_host_name(address))):
        what = "an IP address or a host name" if hosts else "an IP address"
        raise ValueError(f"endpoint {name!r}: address {address!r} is not {what}")
    return Endpoint(
        id=f"{namespace}/{name}",
        name=name,
        namespace=namespace,
        address=address,
        port=_port(name, entry.get("port")),
        rank=0,
        labels=_labels(name, entry.get("labels")),
    )


def is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def is_host_name(address: str) -> bool:
    """A DNS-1123 subdomain: lower-case labels of letters, digits and ``-``, dot-separated."""
    return len(address) <= 253 and _HOST_NAME.fullmatch(address) is not None


def _string(entry: Mapping[str, Any], key: str, *, required: bool) -> str:
    value = entry.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key!r} must be a non-empty string")
    return value.strip()


def _port(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"endpoint {name!r}: port must be an integer")
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"endpoint {name!r}: invalid port {value!r}") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"endpoint {name!r}: port {port} out of range 1..65535")
    return port


def _labels(name: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"endpoint {name!r}: labels must map strings to strings")
    return dict(value)


def _fingerprint(path: str) -> tuple[int, int, int] | None:
    """(mtime_ns, size, inode) or None when the file is missing (e.g. mid-rename)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)


class FileDiscovery(PluginBase):
    """Publishes the endpoints listed in a file; optionally reloads it when it changes."""

    TYPE: ClassVar[str] = "file-discovery"
    HOST_NAMES: ClassVar[bool] = False
    """Whether an address may be a host name (``parse_endpoints``'s ``hosts``)."""

    @dataclass(frozen=True)
    class Params:
        path: str = ""
        watch_file: bool = False
        poll_interval: str = "1s"

        def __post_init__(self) -> None:
            if not self.path:
                raise ValueError("path is required")
            if parse_duration(self.poll_interval) <= 0:
                raise ValueError(f"pollInterval must be positive, got {self.poll_interval!r}")

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._path: str = params.path
        self._poll_seconds = parse_duration(params.poll_interval)
        self._log = handle.logger(self.typed_name)

    async def run(self, publish: Callable[[Sequence[Endpoint]], None]) -> None:
        fingerprint = await asyncio.to_thread(_fingerprint, self._path)
        data = await asyncio.to_thread(_read, self._path)
        endpoints = parse_endpoints(data, self._path, hosts=self.HOST_NAMES)
        publish(endpoints)
        self._log.info("loaded %d endpoints from %s", len(endpoints), self._path)
        if not self.params.watch_file:
            await asyncio.Event().wait()  # nothing more to do until cancelled
            return
        await self._watch(publish, fingerprint, hashlib.sha256(data).digest())

    async def _watch(
        self,
        publish: Callable[[Sequence[Endpoint]], None],
        fingerprint: tuple[int, int, int] | None,
        digest: bytes,
    ) -> None:
        """Poll for changes until cancelled; ``digest`` is the hash of the last content seen."""
        while True:
            await asyncio.sleep(self._poll_seconds)
            current = await asyncio.to_thread(_fingerprint, self._path)
            if current == fingerprint:
                continue
            fingerprint = current
            try:
                data = await asyncio.to_thread(_read, self._path)
            except EndpointsFileError as exc:
                self._log.warning("keeping the previous endpoints: %s", exc)
                digest = b""
                continue
            new_digest = hashlib.sha256(data).digest()
            if new_digest == digest:
                continue
            digest = new_digest
            try:
                endpoints = parse_endpoints(data, self._path, hosts=self.HOST_NAMES)
            except EndpointsFileError as exc:
                self._log.warning("keeping the previous endpoints: %s", exc)
                continue
            publish(endpoints)
            self._log.info("reloaded %d endpoints from %s", len(endpoints), self._path)
