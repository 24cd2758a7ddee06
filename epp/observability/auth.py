"""Authentication and authorization of the metrics port (``--metrics-endpoint-auth``).

Every request to ``/metrics`` and ``/debug/*`` must carry ``Authorization: Bearer <token>``;
the token is judged by a :class:`Reviewer`:

- in Kubernetes mode, the cluster (``epp.k8s.review``): a TokenReview authenticates the token,
  then a SubjectAccessReview asks whether that user may ``get`` the non-resource URL of the
  request path (``/metrics``, ``/debug/config`` …), as controller-runtime's
  ``WithAuthenticationAndAuthorization`` filter does;
- otherwise :class:`StaticToken`: the token in ``$EPP_METRICS_TOKEN`` (compared in constant
  time) may read every path.

Answers, as upstream's: no or malformed ``Authorization`` header or a token the reviewer does
not accept → 401 ``Unauthorized``; an accepted token that may not read the path → 403; the
review itself failing (API server unreachable, timeout) → 500. Verdicts are cached
(:class:`CachedReviewer`): per token and path, bounded in entries, an allow or a deny for
``ALLOW_TTL``/``DENY_TTL`` seconds; review failures are never cached.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware

log = logging.getLogger(__name__)

ALLOW_TTL: Final = 60.0
"""Seconds an allowed (token, path) is remembered."""
DENY_TTL: Final = 10.0
"""Seconds a refused (token, path) is remembered."""
CACHE_ENTRIES: Final = 1024
"""The most verdicts remembered; the least recently used goes first."""


@dataclass(frozen=True)
class Verdict:
    status: int
    """200 allowed, 401 not authenticated, 403 not authorized."""
    user: str = ""


ALLOWED: Final = Verdict(200)
UNAUTHENTICATED: Final = Verdict(401)


class Reviewer(Protocol):
    async def review(self, token: str, path: str, verb: str) -> Verdict:
        """The verdict on ``token`` reading ``path``; raises on a failed review."""
        ...


class StaticToken:
    """One bearer token that may read everything."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the static metrics token is empty")
        self._digest = hashlib.sha256(token.encode()).digest()

    async def review(self, token: str, path: str, verb: str) -> Verdict:
        given = hashlib.sha256(token.encode()).digest()
        return ALLOWED if hmac.compare_digest(given, self._digest) else UNAUTHENTICATED


class CachedReviewer:
    """``inner``'s verdicts, remembered per (token digest, path, verb)."""

    def __init__(
        self,
        inner: Reviewer,
        *,
        clock: Callable[[], float] = time.monotonic,
        allow_ttl: float = ALLOW_TTL,
        deny_ttl: float = DENY_TTL,
        entries: int = CACHE_ENTRIES,
    ) -> None:
        self._inner = inner
        self._clock = clock
        self._ttl = (allow_ttl, deny_ttl)
        self._entries = entries
        self._cache: OrderedDict[tuple[bytes, str, str], tuple[float, Verdict]] = OrderedDict()
        self._pending: dict[tuple[bytes, str, str], asyncio.Future[Verdict]] = {}

    async def review(self, token: str, path: str, verb: str) -> Verdict:
        key = (hashlib.sha256(token.encode()).digest(), path, verb)
        hit = self._cache.get(key)
        if hit is not None and hit[0] > self._clock():
            self._cache.move_to_end(key)
            return hit[1]
        pending = self._pending.get(key)
        if pending is not None:  # one review at a time per key
            return await asyncio.shield(pending)
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            verdict = await self._inner.review(token, path, verb)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        finally:
            del self._pending[key]
        future.set_result(verdict)
        ttl = self._ttl[0] if verdict.status == 200 else self._ttl[1]
        self._cache[key] = (self._clock() + ttl, verdict)
        self._cache.move_to_end(key)
        while len(self._cache) > self._entries:
            self._cache.popitem(last=False)
        return verdict

    def __len__(self) -> int:
        return len(self._cache)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def auth_middleware(reviewer: Reviewer) -> Middleware:
    """An aiohttp middleware that lets a request through only with a verdict of 200."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return _refuse(401, "Unauthorized")
        try:
            verdict = await reviewer.review(token, request.path, request.method.lower())
        except Exception as exc:
            log.warning("metrics auth: review of %s failed: %r", request.path, exc)
            return _refuse(500, "Authentication failed")
        if verdict.status == 401:
            return _refuse(401, "Unauthorized")
        if verdict.status != 200:
            return _refuse(403, f"Authorization denied for user {verdict.user}")
        return await handler(request)

    return authenticate


def _refuse(status: int, text: str) -> web.Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    return web.Response(status=status, text=text + "\n", headers=headers)
