"""The metrics port's reviewer in Kubernetes mode: the cluster decides who may read it.

For a bearer token and a request path, as controller-runtime's
``WithAuthenticationAndAuthorization`` does:

1. a ``TokenReview`` (``authentication.k8s.io/v1``) of the token; ``status.authenticated``
   false → 401;
2. a ``SubjectAccessReview`` (``authorization.k8s.io/v1``) for that user and groups (and extra):
   ``nonResourceAttributes {path, verb}``; ``status.allowed`` false → 403.

Both calls are plain POSTs of the API's JSON through the ``kubernetes`` client (its blocking
calls run in a thread, each within ``REVIEW_TIMEOUT``). The EPP's service account needs
``create`` on ``tokenreviews`` and ``subjectaccessreviews`` (``deploy/kubernetes/base/rbac.yaml``);
the reader needs ``get`` on the non-resource URL (``/metrics``, ``/debug/*``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, Final, Protocol

from epp.config.loader import ConfigError
from epp.observability.auth import (
    ALLOWED,
    UNAUTHENTICATED,
    CachedReviewer,
    Reviewer,
    StaticToken,
    Verdict,
)

log = logging.getLogger(__name__)

REVIEW_TIMEOUT: Final = 5.0
"""Seconds one TokenReview or SubjectAccessReview may take."""


class AuthSettings(Protocol):
    """The options :func:`metrics_reviewer` reads (``epp.settings.Settings`` has them)."""

    @property
    def metrics_endpoint_auth(self) -> bool: ...

    @property
    def metrics_token(self) -> str: ...

    @property
    def kubeconfig(self) -> str: ...

    @property
    def pool_name(self) -> str: ...

    @property
    def endpoint_selector(self) -> str: ...


def metrics_reviewer(s: AuthSettings) -> Reviewer | None:
    """The metrics port's reviewer, or ``None`` for an open port: with auth on, the static
    token when ``$EPP_METRICS_TOKEN`` is set, the cluster's reviews in Kubernetes mode, either
    when both. Auth on with neither leaves the port open, as upstream outside a cluster, and
    says so. ``ConfigError`` when the cluster configuration cannot be loaded."""
    if not s.metrics_endpoint_auth:
        return None
    static = StaticToken(s.metrics_token) if s.metrics_token else None
    kube: Reviewer | None = None
    if s.pool_name or s.endpoint_selector:
        from epp.k8s.client import KubeConfigError, load_api_client

        try:
            kube = CachedReviewer(KubeReviewer(load_api_client(s.kubeconfig)))
        except KubeConfigError as exc:
            raise ConfigError(f"--metrics-endpoint-auth: {exc}") from None
    if static is None and kube is None:
        log.warning(
            "--metrics-endpoint-auth: not in Kubernetes mode and $EPP_METRICS_TOKEN is unset: "
            "/metrics and /debug/* are served without authentication"
        )
        return None
    if static is None or kube is None:
        return static or kube
    return EitherReviewer(static, kube)


class EitherReviewer:
    """The static token first; any other token goes to the cluster."""

    def __init__(self, first: Reviewer, second: Reviewer) -> None:
        self._first, self._second = first, second

    async def review(self, token: str, path: str, verb: str) -> Verdict:
        verdict = await self._first.review(token, path, verb)
        if verdict.status == 200:
            return verdict
        return await self._second.review(token, path, verb)


class KubeReviewer:
    def __init__(self, api: Any, timeout: float = REVIEW_TIMEOUT) -> None:
        from kubernetes import client  # only in Kubernetes mode

        self._authn = client.AuthenticationV1Api(api)
        self._authz = client.AuthorizationV1Api(api)
        self._timeout = timeout

    async def review(self, token: str, path: str, verb: str) -> Verdict:
        review = await self._post(
            self._authn.create_token_review,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return UNAUTHENTICATED
        user = status.get("user") or {}
        spec: dict[str, Any] = {
            "user": user.get("username", ""),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        for key in ("uid", "groups", "extra"):
            if user.get(key):
                spec[key] = user[key]
        access = await self._post(
            self._authz.create_subject_access_review,
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": spec,
            },
        )
        if (access.get("status") or {}).get("allowed"):
            return ALLOWED
        return Verdict(403, spec["user"])

    async def _post(self, fn: Callable[..., Any], body: dict[str, Any]) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            response = fn(
                body, _preload_content=False, _request_timeout=(self._timeout, self._timeout)
            )
            result: dict[str, Any] = json.loads(response.data)
            return result

        async with asyncio.timeout(self._timeout * 2):
            return await asyncio.to_thread(call)
