"""A small Kubernetes API server: plain HTTP on 127.0.0.1, the real list/watch JSON wire protocol.
The tests of Kubernetes mode run the EPP against it, and ``epp bench chaos`` stops it, hangs it
and revokes its token under load.

What it speaks, as the real API server does:

- paths ``/api/v1/namespaces/{ns}/{plural}[/{name}]`` (core) and
  ``/apis/{group}/{version}/namespaces/{ns}/{plural}[/{name}]``; GET (get, list, watch), POST
  (create), PUT (replace), DELETE; discovery at ``/api``, ``/apis``, ``/api/v1``,
  ``/apis/{group}/{version}`` and ``/version``;
- one global ``resourceVersion`` counter (as etcd's revision); every write bumps it;
- lists ``{"kind": "<Kind>List", "metadata": {"resourceVersion"}, "items": [...]}``;
- watches ``?watch=true&resourceVersion=N``: HTTP/1.1 chunked transfer encoding, one
  newline-terminated JSON event per chunk, ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR,
  "object": ...}``; ``timeoutSeconds`` ends the stream cleanly; ``allowWatchBookmarks`` gets
  periodic ``BOOKMARK`` events carrying only ``metadata.resourceVersion``;
- a watch from a ``resourceVersion`` older than the last ``compact()`` gets HTTP 200 and then an
  ``ERROR`` event with a ``Status`` of code 410, reason ``Expired``;
- errors are ``Status`` objects (``NotFound``, ``AlreadyExists``, ``Conflict`` on a stale
  ``metadata.resourceVersion`` in a PUT, ``Unauthorized``, ``BadRequest``);
- bearer-token authentication (``token``; assign another to revoke the one clients hold: they
  get 401 from their next request on); ``fieldSelector`` on ``metadata.name`` /
  ``metadata.namespace`` and equality-based ``labelSelector``.

Controls: ``create/replace/delete/get`` mutate state directly, ``install/uninstall`` add or
remove an API resource, ``compact()`` forgets history, ``drop_watches()`` cuts every open watch
connection without the terminating chunk, ``fail()`` injects error answers, ``hang()`` /
``release()`` stop and resume answering (connections stay open), ``stop()`` then ``start()``
goes away and comes back on the same port with the same objects, and ``requests`` records every
call. Object builders are in ``epp_tools.bench.kube.objects``; the wire types in
``epp_tools.bench.kube.kubeapi``.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from epp_tools.bench.kube.apiserver_http import Handler
from epp_tools.bench.kube.kubeapi import (
    DEFAULT_RESOURCES,
    TOKEN,
    ApiError,
    Fault,
    Request,
    Resource,
    State,
    discovery,
    matcher,
    status,
    timestamp,
)


class LocalApiServer:
    def __init__(
        self,
        resources: Iterable[Resource] = DEFAULT_RESOURCES,
        *,
        bookmark_interval: float = 0.5,
        token: str = TOKEN,
    ) -> None:
        self._cond = threading.Condition()
        self._state = State()
        self._installed: set[Resource] = set(resources)
        self._faults: list[Fault] = []
        self._drop_generation = 0
        self._closing = False
        self._hanging = False
        self._port = 0
        self.bookmark_interval = bookmark_interval
        self.token = token
        self.requests: list[Request] = []
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> LocalApiServer:
        """Listen (again: after ``stop`` on the same port, with the same objects, as an API
        server restarted on a persistent etcd)."""
        with self._cond:
            self._closing = False
        handler = type("Handler", (Handler,), {"api": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self._port), handler)
        self._port = int(self._httpd.server_address[1])
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> LocalApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._port, "start() first"
        return f"http://127.0.0.1:{self._port}"

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "test", "cluster": {"server": self.url}}],
                    "users": [{"name": "test", "user": {"token": self.token}}],
                    "contexts": [
                        {
                            "name": "test",
                            "context": {"cluster": "test", "user": "test", "namespace": namespace},
                        }
                    ],
                    "current-context": "test",
                }
            )
        )
        return path

    # ---- test controls ------------------------------------------------------------------------

    def install(self, resource: Resource) -> None:
        with self._cond:
            self._installed.add(resource)

    def uninstall(self, resource: Resource) -> None:
        with self._cond:
            self._installed.discard(resource)

    def create(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        with self._cond:
            return self._create(resource, obj)

    def replace(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        with self._cond:
            return self._replace(resource, obj)

    def delete(self, resource: Resource, name: str, namespace: str = "default") -> None:
        with self._cond:
            self._delete(resource, namespace, name)

    def get(self, resource: Resource, name: str, namespace: str = "default") -> dict[str, Any]:
        with self._cond:
            return copy.deepcopy(self._get(resource, namespace, name))

    def compact(self) -> int:
        """Forget the history so far: a watch from an older resourceVersion gets 410 Gone."""
        with self._cond:
            self._state.compacted = self._state.rv
            self._state.history.clear()
            return self._state.rv

    def drop_watches(self) -> None:
        """Cut every open watch connection (no terminating chunk: the client sees a broken
        stream, as when an API server restarts)."""
        with self._cond:
            self._drop_generation += 1
            self._cond.notify_all()

    def hang(self) -> None:
        """Stop answering: a request that arrives from now on waits (its connection stays open)
        and open watches deliver nothing, not even bookmarks, until ``release`` or ``stop``."""
        with self._cond:
            self._hanging = True

    def release(self) -> None:
        """Answer again after ``hang``."""
        with self._cond:
            self._hanging = False
            self._cond.notify_all()

    def wait_while_hanging(self) -> None:
        """Block the calling request thread while the server hangs (not when it stops)."""
        with self._cond:
            while self._hanging and not self._closing:
                self._cond.wait(1.0)

    def fail(self, fault: Fault) -> Fault:
        with self._cond:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._cond:
            self._faults.clear()

    def count(self, plural: str, *, watch: bool, method: str = "GET") -> int:
        with self._cond:
            return sum(
                1
                for r in self.requests
                if r.method == method
                and r.is_watch == watch
                and r.path.rstrip("/").endswith("/" + plural)
            )

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._state.rv

    # ---- state (caller holds the lock) --------------------------------------------------------

    def _bump(self, resource: Resource, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        self._state.rv += 1
        obj["metadata"]["resourceVersion"] = str(self._state.rv)
        self._state.history.append((self._state.rv, resource, kind, copy.deepcopy(obj)))
        self._cond.notify_all()
        return copy.deepcopy(obj)

    def _key(self, resource: Resource, obj: dict[str, Any]) -> tuple[Resource, str, str]:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        return (resource, meta["namespace"], meta["name"])

    def _create(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        key = self._key(resource, obj)
        if key in self._state.objects:
            raise ApiError(409, "AlreadyExists", f'{resource.plural} "{key[2]}" already exists')
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        obj["metadata"].setdefault("uid", str(uuid.uuid4()))
        obj["metadata"].setdefault("creationTimestamp", timestamp())
        self._state.objects[key] = obj
        return self._bump(resource, "ADDED", obj)

    def _replace(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        key = self._key(resource, obj)
        current = self._state.objects.get(key)
        if current is None:
            raise ApiError(404, "NotFound", f'{resource.plural} "{key[2]}" not found')
        sent_rv = obj["metadata"].get("resourceVersion")
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            group = f".{resource.group}" if resource.group else ""
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource.plural}{group} "{key[2]}": the '
                "object has been modified; please apply your changes to the latest version "
                "and try again",
            )
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        for kept in ("uid", "creationTimestamp"):
            obj["metadata"][kept] = current["metadata"][kept]
        self._state.objects[key] = obj
        return self._bump(resource, "MODIFIED", obj)

    def _delete(self, resource: Resource, namespace: str, name: str) -> dict[str, Any]:
        obj = self._state.objects.pop((resource, namespace, name), None)
        if obj is None:
            raise ApiError(404, "NotFound", f'{resource.plural} "{name}" not found')
        return self._bump(resource, "DELETED", obj)

    def _get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any]:
        obj = self._state.objects.get((resource, namespace, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{resource.plural} "{name}" not found')
        return obj

    def _list(
        self, resource: Resource, namespace: str, query: dict[str, str]
    ) -> list[dict[str, Any]]:
        match = matcher(query)
        return [
            copy.deepcopy(o)
            for (r, ns, _), o in sorted(self._state.objects.items(), key=lambda kv: kv[0][1:])
            if r == resource and ns == namespace and match(o)
        ]

    def _fault(self, method: str, path: str, watch: bool) -> Fault | None:
        for fault in self._faults:
            if (
                fault.method == method
                and fault.path_contains in path
                and (fault.watch is None or fault.watch == watch)
            ):
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    def _resource(self, group: str, version: str, plural: str) -> Resource:
        for r in self._installed:
            if (r.group, r.version, r.plural) == (group, version, plural):
                return r
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    # ---- watch --------------------------------------------------------------------------------

    def _watch_events(
        self, resource: Resource, namespace: str, query: dict[str, str]
    ) -> Iterator[dict[str, Any] | None]:
        """Events for one watch; ``None`` means the connection must be cut abruptly."""
        match = matcher(query)
        timeout = float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        deadline = time.monotonic() + timeout
        next_bookmark = time.monotonic() + self.bookmark_interval
        with self._cond:
            generation = self._drop_generation
            start = query.get("resourceVersion") or ""
            if start in ("", "0"):
                initial = self._list(resource, namespace, query)
                pending = [{"type": "ADDED", "object": o} for o in initial]
                cursor = self._state.rv
            else:
                cursor = int(start)
                pending = []
                if cursor < self._state.compacted:
                    message = f"too old resource version: {cursor} ({self._state.compacted})"
                    pending = [{"type": "ERROR", "object": status(410, "Expired", message)}]
        if pending and pending[0]["type"] == "ERROR":
            yield pending[0]
            return
        while True:
            yield from pending
            pending = []
            with self._cond:
                while True:
                    if self._closing or generation != self._drop_generation:
                        yield None
                        return
                    fresh = [h for h in self._state.history if h[0] > cursor]
                    now = time.monotonic()
                    if self._hanging:
                        self._cond.wait(1.0)
                        continue
                    if fresh or now >= deadline or (bookmarks and now >= next_bookmark):
                        break
                    self._cond.wait(min(deadline, next_bookmark) - now)
                for rv, res, kind, obj in fresh:
                    cursor = rv
                    meta = obj["metadata"]
                    if res == resource and meta["namespace"] == namespace and match(obj):
                        pending.append({"type": kind, "object": copy.deepcopy(obj)})
                if not fresh and bookmarks and time.monotonic() >= next_bookmark:
                    next_bookmark = time.monotonic() + self.bookmark_interval
                    pending.append(
                        {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": resource.kind,
                                "apiVersion": resource.api_version,
                                "metadata": {"resourceVersion": str(self._state.rv)},
                            },
                        }
                    )
            if not pending and time.monotonic() >= deadline:
                return

    def _discovery(self, path: str) -> dict[str, Any]:
        return discovery(self._installed, path)
