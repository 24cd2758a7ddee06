"""The HTTP side of the local API server (``epp_tools.bench.kube.apiserver``): one request →
routing, authentication, injected faults, JSON answers and chunked watch streams."""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from epp_tools.bench.kube.kubeapi import ApiError, Request, Resource


class Handler(BaseHTTPRequestHandler):
    api: Any
    """The ``LocalApiServer`` this handler serves (set on the subclass it builds)."""
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
