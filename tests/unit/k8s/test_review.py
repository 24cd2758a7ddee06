"""The metrics port in Kubernetes mode, against a small API server speaking the real TokenReview
and SubjectAccessReview JSON: 401 for an unknown token, 403 for a path the user may not get,
200 otherwise, verdicts cached, a failing API server → 500."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from epp.k8s.review import metrics_reviewer
from epp.observability.decisions import DecisionLog
from epp.observability.http import DebugViews, MetricsServer, PortOptions
from tests.conftest import make_settings

EPP_TOKEN = "epp-service-account-token"
USERS = {"reader-token": {"username": "system:serviceaccount:monitoring:prometheus",
                          "uid": "u-1", "groups": ["system:serviceaccounts"]}}  # fmt: skip
ALLOWED = {("system:serviceaccount:monitoring:prometheus", "/metrics", "get")}


class ReviewApi:
    """POST /apis/authentication.k8s.io/v1/tokenreviews and
    /apis/authorization.k8s.io/v1/subjectaccessreviews, as the API server answers them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.failing = False
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.calls.append((self.path, body))
                if self.headers.get("Authorization") != f"Bearer {EPP_TOKEN}":
                    return self._send(401, {"kind": "Status", "code": 401})
                if api.failing:
                    return self._send(500, {"kind": "Status", "code": 500})
                if self.path == "/apis/authentication.k8s.io/v1/tokenreviews":
                    user = USERS.get(body["spec"]["token"])
                    status = {"authenticated": True, "user": user} if user else {}
                elif self.path == "/apis/authorization.k8s.io/v1/subjectaccessreviews":
                    spec = body["spec"]
                    attrs = spec["nonResourceAttributes"]
                    ok = (spec["user"], attrs["path"], attrs["verb"]) in ALLOWED
                    status = {"allowed": ok} if ok else {"allowed": False, "reason": "no RBAC"}
                else:
                    return self._send(404, {"kind": "Status", "code": 404})
                self._send(201, {**body, "status": status})

            def _send(self, code: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, path: Path) -> Path:
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "t", "cluster": {"server": self.url}}],
            "users": [{"name": "t", "user": {"token": EPP_TOKEN}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
            "current-context": "t",
        }
        path.write_text(json.dumps(cfg))
        return path


@pytest.fixture
def review_api() -> Iterator[ReviewApi]:
    api = ReviewApi()
    thread = threading.Thread(target=api.server.serve_forever, daemon=True)
    thread.start()
    yield api
    api.server.shutdown()
    api.server.server_close()


@pytest.fixture
async def port(review_api: ReviewApi, tmp_path: Path) -> AsyncIterator[int]:
    settings = make_settings(
        None, pool_name="pool", kubeconfig=str(review_api.kubeconfig(tmp_path / "kubeconfig"))
    )
    views = DebugViews(CollectorRegistry(), dict, list, DecisionLog(), [])
    server = MetricsServer(views, PortOptions(reviewer=metrics_reviewer(settings)))
    yield await server.start("127.0.0.1", 0)
    await server.stop()


async def get(port: int, path: str, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{port}{path}", headers=headers) as r,
    ):
        return r.status, await r.text()


async def test_the_cluster_decides(port: int, review_api: ReviewApi) -> None:
    assert (await get(port, "/metrics", None))[0] == 401
    assert review_api.calls == []  # no token: nothing to review
    assert (await get(port, "/metrics", "bogus"))[0] == 401
    assert [p for p, _ in review_api.calls] == ["/apis/authentication.k8s.io/v1/tokenreviews"]
    assert review_api.calls[0][1]["spec"] == {"token": "bogus"}
    assert review_api.calls[0][1]["kind"] == "TokenReview"
    review_api.calls.clear()

    assert (await get(port, "/metrics", "reader-token"))[0] == 200
    sar = review_api.calls[1][1]
    assert sar["apiVersion"] == "authorization.k8s.io/v1" and sar["kind"] == "SubjectAccessReview"
    assert sar["spec"] == {
        "user": "system:serviceaccount:monitoring:prometheus",
        "uid": "u-1",
        "groups": ["system:serviceaccounts"],
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }
    status, body = await get(port, "/debug/config", "reader-token")
    assert status == 403 and "prometheus" in body
    calls = len(review_api.calls)
    assert (await get(port, "/metrics", "reader-token"))[0] == 200
    assert (await get(port, "/debug/config", "reader-token"))[0] == 403
    assert len(review_api.calls) == calls  # both verdicts cached


async def test_a_failing_api_server_gives_500(port: int, review_api: ReviewApi) -> None:
    review_api.failing = True
    assert (await get(port, "/metrics", "reader-token"))[0] == 500
    review_api.failing = False
    assert (await get(port, "/metrics", "reader-token"))[0] == 200  # the failure was not cached


async def test_the_static_token_also_works_in_kubernetes_mode(
    review_api: ReviewApi, tmp_path: Path
) -> None:
    kubeconfig = str(review_api.kubeconfig(tmp_path / "kubeconfig"))
    settings = make_settings(None, pool_name="pool", kubeconfig=kubeconfig, metrics_token="st")
    views = DebugViews(CollectorRegistry(), dict, list, DecisionLog(), [])
    server = MetricsServer(views, PortOptions(reviewer=metrics_reviewer(settings)))
    port = await server.start("127.0.0.1", 0)
    try:
        assert (await get(port, "/debug/config", "st"))[0] == 200
        assert review_api.calls == []
        assert (await get(port, "/metrics", "reader-token"))[0] == 200
        assert (await get(port, "/metrics", "other"))[0] == 401
    finally:
        await server.stop()
