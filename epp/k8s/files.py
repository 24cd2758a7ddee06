"""InferenceObjective and InferenceModelRewrite objects in YAML files (``--objectives-file``).

Priorities, flow control and model rewrites then work without Kubernetes (file discovery, a
laptop, Slurm) exactly as with the CRDs. A file holds any number of YAML documents (``---``), each
an object with the CRD schema, or a ``kind: List`` with ``items``::

    apiVersion: llm-d.ai/v1alpha2
    kind: InferenceObjective
    metadata: {name: interactive}
    spec: {priority: 10}
    ---
    apiVersion: llm-d.ai/v1alpha2
    kind: InferenceModelRewrite
    metadata: {name: llama-canary}
    spec:
      rules:
      - matches: [{model: {type: Exact, value: llama}}]
        targets: [{modelRewrite: llama-v1, weight: 90}, {modelRewrite: llama-v2, weight: 10}]

``spec.poolRef`` is optional here; when present and the EPP runs in InferencePool mode, objects
naming another pool are ignored, as in the cluster. ``metadata.namespace`` is ignored.
``apiVersion`` may be ``llm-d.ai/v1alpha2`` or, for objectives, the legacy
``inference.networking.x-k8s.io/v1alpha2``. Any other kind, an unknown apiVersion or an invalid
object rejects the whole file: at startup that is a startup error; on reload the previous objects
stay and the error is logged. Files are polled for changes (mtime, size, inode, then a content
hash) every ``poll_interval`` seconds.

Rewrite precedence among file objects without ``creationTimestamp`` follows declaration order
(files in flag order, documents in file order); they rank before cluster objects.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from epp.k8s import objectives as obj_api
from epp.k8s import rewrites as rw_api
from epp.k8s.meta import DecodeError, PoolRef, mapping
from epp.requestcontrol.rewrites import ModelRewrite

MAX_FILE_BYTES: Final = 1 << 20
_Loader: Final = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ObjectsFileError(ValueError):
    """An objects file cannot be used; the message names the file and the object."""


@dataclass(frozen=True, slots=True)
class DeclaredObjects:
    objectives: tuple[obj_api.Objective, ...] = ()
    rewrites: tuple[tuple[PoolRef | None, ModelRewrite], ...] = ()


def _documents(data: bytes, path: str) -> Iterator[Any]:
    try:
        for document in yaml.load_all(data, Loader=_Loader):  # _Loader is a safe loader
            if document is None:
                continue
            doc = mapping(document, f"{path}: document")
            if doc.get("kind") == "List":
                items = doc.get("items") or []
                if not isinstance(items, list):
                    raise ObjectsFileError(f"{path}: List.items must be a list")
                yield from items
            else:
                yield doc
    except yaml.YAMLError as exc:
        raise ObjectsFileError(f"{path}: not valid YAML: {exc}") from None
    except DecodeError as exc:
        raise ObjectsFileError(str(exc)) from None


def parse_objects(data: bytes, path: str = "<memory>", *, first_order: int = 0) -> DeclaredObjects:
    objectives: list[obj_api.Objective] = []
    rewrites: list[tuple[PoolRef | None, ModelRewrite]] = []
    for index, doc in enumerate(_documents(data, path)):
        try:
            kind = mapping(doc, "object").get("kind")
            api_version = doc.get("apiVersion")
            if kind == obj_api.KIND and api_version in obj_api.API_VERSIONS:
                objectives.append(obj_api.decode_objective(doc, require_pool_ref=False))
            elif kind == rw_api.KIND and api_version == rw_api.API_VERSION:
                rewrites.append(
                    rw_api.decode_rewrite(doc, require_pool_ref=False, order=first_order + index)
                )
            else:
                raise DecodeError(f"unsupported object {api_version!r} {kind!r}")
        except DecodeError as exc:
            raise ObjectsFileError(f"{path}: object {index}: {exc}") from None
    return DeclaredObjects(tuple(objectives), tuple(rewrites))


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ObjectsFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ObjectsFileError(f"{path}: larger than the 1 MiB limit")
    return data


def _fingerprint(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _merge(parts: Sequence[DeclaredObjects]) -> DeclaredObjects:
    return DeclaredObjects(
        tuple(o for p in parts for o in p.objectives),
        tuple(r for p in parts for r in p.rewrites),
    )


class ObjectFiles:
    """Loads the files once (``load``, raising on error) and then follows them (``run``)."""

    ORDER_STRIDE: Final = 1_000_000
    """Declaration-order offset per file, so the files' objects keep flag order."""

    def __init__(
        self,
        paths: Sequence[str],
        publish: Callable[[DeclaredObjects], None],
        *,
        poll_interval: float = 1.0,
        logger: logging.Logger | None = None,
    ) -> None:
        self._paths = tuple(paths)
        self._publish = publish
        self._poll = poll_interval
        self._log = logger or logging.getLogger(__name__)
        self._parts: list[DeclaredObjects] = [DeclaredObjects() for _ in self._paths]
        self._fingerprints: list[tuple[int, int, int] | None] = [None] * len(self._paths)
        self._digests: list[bytes] = [b""] * len(self._paths)

    def load(self) -> DeclaredObjects:
        """Read every file; any error raises ``ObjectsFileError``."""
        for i, path in enumerate(self._paths):
            self._fingerprints[i] = _fingerprint(path)
            data = _read(path)
            self._parts[i] = parse_objects(data, path, first_order=i * self.ORDER_STRIDE)
            self._digests[i] = hashlib.sha256(data).digest()
        merged = _merge(self._parts)
        self._publish(merged)
        return merged

    def _reload(self, i: int) -> bool:
        path = self._paths[i]
        current = _fingerprint(path)
        if current == self._fingerprints[i]:
            return False
        self._fingerprints[i] = current
        try:
            data = _read(path)
            digest = hashlib.sha256(data).digest()
            if digest == self._digests[i]:
                return False
            self._parts[i] = parse_objects(data, path, first_order=i * self.ORDER_STRIDE)
        except ObjectsFileError as exc:
            self._log.warning("keeping the previous objects: %s", exc)
            return False
        self._digests[i] = digest
        return True

    def poll_once(self) -> DeclaredObjects | None:
        """Reload changed files (blocking: run it in a worker thread); the merged objects when
        something changed, else None."""
        changed = [self._reload(i) for i in range(len(self._paths))]
        return _merge(self._parts) if any(changed) else None

    async def run(self) -> None:
        """Follow the files until cancelled; publishes on the event loop."""
        while True:
            await asyncio.sleep(self._poll)
            merged = await asyncio.to_thread(self.poll_once)
            if merged is not None:
                self._publish(merged)
                self._log.info(
                    "reloaded objects files: %d objectives, %d rewrites",
                    len(merged.objectives),
                    len(merged.rewrites),
                )
