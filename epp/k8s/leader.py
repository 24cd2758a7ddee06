"""Leader election with a ``coordination.k8s.io/v1`` Lease (spec §10), as client-go does it.

Lease: ``epp-<poolNamespace>-<poolName>.llm-d.ai`` in the pool's namespace. Every
``retry_period`` each replica reads the Lease and:

- creates it with itself as holder when it does not exist;
- takes it over when it has no holder (released) or when its record has not changed for
  ``leaseDurationSeconds`` *as observed on this replica's monotonic clock* (the holder's
  ``renewTime`` is never compared with our wall clock, so clock skew does not matter);
- renews it when it is the holder.

Writes carry the ``resourceVersion`` that was read: when two replicas race, the API server answers
one of them 409 Conflict and that one stays a follower. A leader that has not renewed for
``renew_deadline`` (shorter than the lease duration) stops leading by itself, even while an API
call hangs, so two leaders never overlap. On shutdown ``release()`` empties ``holderIdentity`` so a
follower takes over at its next retry instead of waiting for expiry.

Our flags (upstream uses controller-runtime's fixed defaults): ``--ha-lease-duration`` (15s),
``--ha-renew-deadline`` (10s), ``--ha-retry-period`` (2s). Unlike controller-runtime, losing the
lease does not exit the process: the replica becomes a follower again (readiness NOT_SERVING) and
keeps competing.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import logging
import math
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

LEASE_API_VERSION: Final = "coordination.k8s.io/v1"


class Conflict(Exception):
    """The API server refused a write: the object changed since it was read, or exists."""


class LeaseClient(Protocol):
    def get(self, name: str) -> dict[str, Any] | None: ...

    def create(self, lease: dict[str, Any]) -> dict[str, Any]: ...

    def replace(self, lease: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class ElectionConfig:
    lease_name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period}s / {self.renew_deadline}s / {self.lease_duration}s"
            )


def lease_name(namespace: str, pool_name: str) -> str:
    return f"epp-{namespace}-{pool_name}.llm-d.ai"


def default_identity() -> str:
    """``<hostname>_<uuid>``, unique across restarts of the same pod (as controller-runtime)."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def micro_time(now: datetime.datetime) -> str:
    """Kubernetes ``MicroTime``: RFC 3339 with exactly six fractional digits, UTC."""
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaderElector:
    def __init__(
        self,
        leases: LeaseClient,
        config: ElectionConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = _utcnow,
        logger: logging.Logger | None = None,
    ) -> None:
        self._leases = leases
        self.config = config
        self._clock = clock
        self._wall = wall
        self._log = logger or logging.getLogger(__name__)
        self._leader = False
        self._renewed_at = -math.inf
        self._observed: dict[str, Any] | None = None
        self._observed_at = -math.inf
        # A round runs in a worker thread, which cancelling ``run`` does not stop: ``release``
        # waits for a round under way, and no round runs after it (else that round could win
        # the lease back, or make the release's write conflict and leave the lease held).
        self._lock = threading.Lock()
        self._released = False

    def is_leader(self) -> bool:
        """Holder of the lease, renewed within the renew deadline."""
        return self._leader and self._clock() - self._renewed_at < self.config.renew_deadline

    # ---- one round (blocking: called in a worker thread) --------------------------------------

    def try_acquire_or_renew(self) -> bool:
        cfg = self.config
        now = self._clock()
        stamp = micro_time(self._wall())
        duration = math.ceil(cfg.lease_duration)
        current = self._leases.get(cfg.lease_name)
        if current is None:
            fresh: dict[str, Any] = {
                "holderIdentity": cfg.identity,
                "leaseDurationSeconds": duration,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 0,
            }
            lease = {
                "apiVersion": LEASE_API_VERSION,
                "kind": "Lease",
                "metadata": {"name": cfg.lease_name, "namespace": cfg.namespace},
                "spec": fresh,
            }
            try:
                self._leases.create(lease)
            except Conflict:
                return False
            return self._won(fresh, now)
        spec: dict[str, Any] = dict(current.get("spec") or {})
        if spec != self._observed:
            self._observed, self._observed_at = spec, now
        holder = spec.get("holderIdentity") or ""
        held_for = float(spec.get("leaseDurationSeconds") or duration)
        if holder and holder != cfg.identity and now < self._observed_at + held_for:
            return False
        new_spec = {
            "holderIdentity": cfg.identity,
            "leaseDurationSeconds": duration,
            "acquireTime": spec.get("acquireTime") if holder == cfg.identity else stamp,
            "renewTime": stamp,
            "leaseTransitions": int(spec.get("leaseTransitions") or 0)
            + (0 if holder == cfg.identity else 1),
        }
        updated = copy.deepcopy(current)
        updated["spec"] = new_spec
        try:
            self._leases.replace(updated)
        except Conflict:
            return False
        return self._won(new_spec, now)

    def _won(self, spec: dict[str, Any], now: float) -> bool:
        self._observed, self._observed_at = spec, now
        self._renewed_at = now
        return True

    def release(self) -> bool:
        """Give the lease up (if held): empty holder, 1s duration, as client-go's
        ReleaseOnCancel; no round runs after it. Returns True when a held lease was released."""
        with self._lock:
            self._released = True
            return self._release()

    def _release(self) -> bool:
        if not self._leader:
            return False
        self._leader = False
        current = self._leases.get(self.config.lease_name)
        if current is None or (current.get("spec") or {}).get("holderIdentity") != (
            self.config.identity
        ):
            return False
        stamp = micro_time(self._wall())
        updated = copy.deepcopy(current)
        updated["spec"] = {
            **(current.get("spec") or {}),
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": stamp,
            "renewTime": stamp,
        }
        try:
            self._leases.replace(updated)
        except Conflict:
            return False
        self._log.info("released lease %s", self.config.lease_name)
        return True

    def holder(self) -> str:
        """Who holds the lease now, as the API server says (``""``: nobody). Blocking."""
        current = self._leases.get(self.config.lease_name)
        return str(((current or {}).get("spec") or {}).get("holderIdentity") or "")

    async def await_successor(self, stop: asyncio.Event) -> str:
        """After ``release``: the identity of the replica that took the lease, once one has
        (polled every half retry period; an API error is a missed poll), or ``""`` when ``stop``
        is set first. The caller bounds the wait."""
        while not stop.is_set():
            try:
                holder = await asyncio.to_thread(self.holder)
            except Exception as exc:
                self._log.warning("lease %s: %r", self.config.lease_name, exc)
                holder = ""
            if holder and holder != self.config.identity:
                return holder
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.retry_period / 2)
        return ""

    # ---- the loop -------------------------------------------------------------------------------

    def _round(self) -> None:
        with self._lock:
            if not self._released:
                self._compete()

    def _compete(self) -> None:
        try:
            renewed = self.try_acquire_or_renew()
        except Exception as exc:  # API errors: a missed round, not a crash
            self._log.warning("lease %s: %s: %s", self.config.lease_name, type(exc).__name__, exc)
            renewed = False
        was = self._leader
        if renewed:
            self._leader = True
        elif self._leader and self._clock() - self._renewed_at >= self.config.renew_deadline:
            self._leader = False
        if self._leader != was:
            self._log.info(
                "%s leadership of lease %s (identity %s)",
                "acquired" if self._leader else "lost",
                self.config.lease_name,
                self.config.identity,
            )

    async def run(self) -> None:
        """Compete for the lease until cancelled (releasing is the caller's call)."""
        while True:
            await asyncio.to_thread(self._round)
            await asyncio.sleep(self.config.retry_period)
