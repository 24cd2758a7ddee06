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
call. The resources it serves and the object builders are in ``epp_tools.bench.kube.objects``.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from epp_tools.bench.kube.objects import DEFAULT_RESOURCES, Resource, timestamp

TOKEN = "test-token"


@dataclass
class Fault:
    """Answer matching requests with ``status`` (``remaining`` times; None = until cleared)."""

    status: int
    method: str = "GET"
    path_contains: str = ""
    watch: bool | None = None
    remaining: int | None = None


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")


@dataclass
class State:
    rv: int = 0
    compacted: int = 0
    objects: dict[tuple[Resource, str, str], dict[str, Any]] = field(default_factory=dict)
    history: list[tuple[int, Resource, str, dict[str, Any]]] = field(default_factory=list)


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.body = status(code, reason, message)


def matcher(query: dict[str, str]) -> Callable[[dict[str, Any]], bool]:
    fields = _pairs(query.get("fieldSelector", ""), {"metadata.name", "metadata.namespace"})
    labels = _pairs(query.get("labelSelector", ""), None)

    def match(obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata", {})
        for (key, op), value in fields.items():
            actual = meta.get(key.split(".", 1)[1], "")
            if (actual == value) != (op == "="):
                return False
        obj_labels = meta.get("labels") or {}
        for (key, op), value in labels.items():
            if (obj_labels.get(key) == value) != (op == "="):
                return False
        return True

    return match


def _pairs(text: str, allowed: set[str] | None) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        op = "!=" if "!=" in part else "="
        key, _, value = part.replace("==", "=").partition(op)
        if not _ or (allowed is not None and key not in allowed):
            raise ApiError(400, "BadRequest", f'unable to parse requirement: "{part}"')
        out[(key.strip(), op)] = value.strip()
    return out


def discovery(resources: Iterable[Resource], path: str) -> dict[str, Any]:
    """The discovery document at ``path`` (``/version``, ``/api``, ``/apis``, a group version)."""
    installed = sorted(resources, key=lambda r: (r.group, r.version, r.plural))
    if path == "/version":
        return {"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/apis":
        groups: dict[str, list[str]] = {}
        for r in installed:
            if r.group and r.version not in groups.setdefault(r.group, []):
                groups[r.group].append(r.version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                }
                for g, vs in groups.items()
            ],
        }
    parts = path.strip("/").split("/")
    group_version = "/".join(parts[1:])
    resources = [r for r in installed if r.prefix == path.rstrip("/")]
    if not resources:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {
                "name": r.plural,
                "singularName": r.kind.lower(),
                "namespaced": True,
                "kind": r.kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            }
            for r in resources
        ],
    }


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


class Handler(BaseHTTPRequestHandler):
    api: LocalApiServer
    """The server this handler serves (set on the subclass ``LocalApiServer.start`` builds)."""
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        path = split.path
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        request = Request(method, path, query)
        api = self.api
        api.wait_while_hanging()
        try:
            with api._cond:
                api.requests.append(request)
                if self.headers.get("Authorization") != f"Bearer {api.token}":
                    raise ApiError(401, "Unauthorized", "Unauthorized")
                fault = api._fault(method, path, request.is_watch)
            if fault is not None:
                raise ApiError(fault.status, "InternalError", f"injected fault {fault.status}")
            if path in ("/api", "/apis", "/version") or path.count("/") <= 3:
                with api._cond:
                    self._json(200, api._discovery(path))
                return
            resource, namespace, name = self._route(path)
            if method == "GET" and name is None and request.is_watch:
                self._stream(api._watch_events(resource, namespace, query))
                return
            with api._cond:
                code, payload = self._dispatch(method, resource, namespace, name, query, body)
            self._json(code, payload)
        except ApiError as exc:
            self._json(exc.body["code"], exc.body)

    def _route(self, path: str) -> tuple[Resource, str, str | None]:
        parts = path.strip("/").split("/")
        if parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        else:
            group, version, rest = parts[1], parts[2], parts[3:]
        if len(rest) < 3 or rest[0] != "namespaces" or len(rest) > 4:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        resource = self.api._resource(group, version, rest[2])
        return resource, rest[1], rest[3] if len(rest) == 4 else None

    def _dispatch(
        self,
        method: str,
        resource: Resource,
        namespace: str,
        name: str | None,
        query: dict[str, str],
        body: bytes,
    ) -> tuple[int, dict[str, Any]]:
        api = self.api
        if method == "GET" and name is None:
            return 200, {
                "kind": f"{resource.kind}List",
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": str(api._state.rv)},
                "items": api._list(resource, namespace, query),
            }
        if method == "GET" and name is not None:
            return 200, copy.deepcopy(api._get(resource, namespace, name))
        if method == "DELETE" and name is not None:
            return 200, api._delete(resource, namespace, name)
        try:
            obj = json.loads(body or b"{}")
        except ValueError:
            raise ApiError(400, "BadRequest", "invalid JSON body") from None
        obj.setdefault("metadata", {}).setdefault("namespace", namespace)
        if method == "POST" and name is None:
            return 201, api._create(resource, obj)
        if method == "PUT" and name is not None:
            if obj["metadata"].get("name") != name:
                raise ApiError(400, "BadRequest", "the name of the object does not match")
            return 200, api._replace(resource, obj)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    def _json(self, code: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: Iterator[dict[str, Any] | None]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in events:
                if event is None:  # cut the connection mid-stream
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
