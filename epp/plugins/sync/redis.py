"""``redis-syncer``: carries routing facts between EPP replicas through one Redis stream per pool.

The ``ReplicaSyncer`` of ``epp.plugin.sharing`` over Redis Streams. Each replica appends its
batch (plugin name → facts) as one entry, ``XADD <prefix>:facts MAXLEN ~ <maxLen> * o <replica>
f <msgpack batch>``, and reads the others' with ``XREAD COUNT <readCount> BLOCK <wait>`` from
its cursor (the last entry id it read): a receive returns as soon as a peer appends an entry, or
when the engine's wait (one sync interval, at most 5 s) is over, so facts reach the other
replicas a round trip after they were published. Publishing and receiving use a connection
each, so a publish never queues behind a waiting read. The stream is the bounded log:
approximate trimming keeps at least ``maxLen`` entries and drops older ones in whole nodes
(cheap); a replica that starts replays the newest ``replayCount`` entries (``XREVRANGE``, pages
of 200) before it reports ready. An entry's ids come from the Redis clock, so a reader that was
away resumes where it stopped (or at the oldest entry still kept). When the stream is empty or
ends before the cursor (Redis restarted without persistence, or the key was deleted) the cursor
goes back to ``0-0``, so nothing written afterwards is missed whatever the ids. Streams were
chosen over pub/sub because they are the catch-up log and the live feed in one: nothing is lost
between a restart and a subscription, and a replica cut off from Redis catches up by reading on
from its cursor.

Batches are msgpack (``msgspec``): facts are JSON values, and 64-bit block hashes cost 9 bytes
instead of 20 as JSON text. A batch that cannot be encoded is dropped and counted, not retried.

Cost, measured on one core against a local ``redis-server`` 7.0 (``redis-py`` 8.1, msgspec): a
realistic tick of one replica at 100 requests/s with 200 ms ticks (one prefix fact per endpoint
touched, 8 endpoints, 2,000 new block hashes in all) is an 18 KB entry (41 KB as JSON). Publishing
it takes 0.18 ms; receiving and decoding a round of four such entries (three peers and its own)
0.54 ms; an idle receive 0.20 ms (one round trip: ``XREAD`` and the emptiness check are
pipelined; a waiting ``XREAD`` costs nothing while it waits). That is about 0.4% of a core per
replica for the transport; applying the facts costs what the index work of that traffic costs
(``approx-prefix-cache-producer``: 1.8 ms for 2,000 new blocks, 0.2 ms when already known). With
prompt sharing (``share_soon``) the same facts travel in more, smaller entries (at most one per
5 ms per replica, 20 ms under load). A replay of 1,000 entries takes 0.15 s; Redis holds
about 20 MB for a pool's log at the default ``maxLen``.

Every Redis call runs under ``timeout`` (socket connect and read timeouts, and an overall bound;
a waiting receive under ``timeout`` plus its wait); redis-py's own retries are off (the engine
retries). After a failure, or a receive cancelled while it waits (the EPP stopping), that side's
connection is dropped and a new one is made on the next call; the cursor moves only when entries
were returned. The password file is read at every new connection, so a rotated Secret is picked
up without a restart.

Parameters:

- ``url`` (default ``redis://127.0.0.1:6379/0``): ``redis://`` or ``rediss://`` (TLS), with an
  optional database number. Credentials may be in the URL or in the parameters, not both.
- ``username`` (default empty: the default user), ``password`` or ``passwordFile`` (a file holding
  the password, e.g. a mounted Secret; trailing newlines are ignored). Not both. The commands
  used are ``XADD``, ``XREAD`` and ``XREVRANGE`` on the one key, so the least ACL is
  ``user epp on >… ~epp:* +xadd +xread +xrevrange`` (with the default ``keyPrefix``).
- ``caFile``, ``certFile``, ``keyFile`` (PEM files; ``rediss://`` only): the CA that signed the
  server's certificate (default: the system store) and a client certificate and key when the
  server requires them (``certFile`` may hold the key too). ``insecureSkipVerify`` (default false)
  accepts any server certificate.
- ``keyPrefix`` (default ``epp:<namespace>/<pool>``, from the EPP's ``--pool-namespace`` and
  ``--pool-name``; ``epp:<namespace>/default`` without a pool name): the stream is
  ``<keyPrefix>:facts``. Replicas of one pool must share it; pools sharing a Redis must not.
- ``maxLen`` (default 1000 entries, ≥ 1): the log's length (approximately; ``MAXLEN ~``).
- ``replayCount`` (default 0 = ``maxLen``): entries a starting replica replays.
- ``readCount`` (default 500, ≥ 1): most entries one receive returns (a replica that lags
  further catches up over the next ticks).
- ``timeout`` (Go duration, default ``1s``, > 0): bound of every Redis call.
- ``bootstrapTimeout`` (Go duration, default ``5s``): how long a starting replica waits for its
  replay before it reports ready anyway (it keeps trying, and applies the tail when Redis comes).

The replica id is ``<POD_NAME or hostname>-<6 random hex digits>``, fixed when the plugin is built:
a restarted replica is a new one (its predecessor's facts are applied, not skipped).

Metrics (labels ``plugin_name``, ``direction`` = ``published`` / ``received``):
``llm_d_epp_redis_syncer_bytes_total`` (entry payload bytes) and
``llm_d_epp_redis_syncer_dropped_entries_total`` (batches that could not be encoded, entries that
could not be decoded). Errors, lag and the outbox are the engine's ``llm_d_epp_state_sync_*``.

YAML::

    plugins:
    - type: redis-syncer
      parameters:
        url: rediss://redis.epp-system.svc:6379
        username: epp
        passwordFile: /var/run/secrets/redis/password
        caFile: /var/run/secrets/redis/ca.crt
    dataLayer:
      crossReplicaSyncerPluginRef: redis-syncer
      crossReplicaSyncInterval: 200ms

Upstream (llm-d-router) defines ``crossReplicaSyncerPluginRef`` but ships no syncer; its
interface is a per-endpoint key/value store, this one a log of facts (see ``epp.plugin.sharing``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final
from urllib.parse import urlsplit

import msgspec
from prometheus_client import Counter
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.credentials import CredentialProvider

from epp.plugin import Delivery, Handle, PluginBase
from epp.plugin.metrics import metric_family
from epp.plugin.units import parse_duration

REPLAY_PAGE: Final = 200
MAX_WAIT: Final = 5.0
"""Longest a receive blocks in ``XREAD`` (a longer wait is cut to this)."""
START: Final = "0-0"
_LABELS: Final = ("plugin_name", "direction")


class _PasswordFile(CredentialProvider):
    """Reads the password at every new connection (a rotated Secret needs no restart)."""

    def __init__(self, path: str, username: str) -> None:
        self._path = Path(path)
        self._username = username

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        password = self._path.read_text().rstrip("\r\n")
        return (self._username, password) if self._username else (password,)

    async def get_credentials_async(self) -> tuple[str] | tuple[str, str]:
        return self.get_credentials()


def _stream_id(raw: bytes | str) -> tuple[int, int]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class RedisSyncer(PluginBase):
    TYPE: ClassVar[str] = "redis-syncer"

    @dataclass(frozen=True)
    class Params:
        url: str = "redis://127.0.0.1:6379/0"
        username: str = ""
        password: str = ""
        password_file: str = ""
        ca_file: str = ""
        cert_file: str = ""
        key_file: str = ""
        insecure_skip_verify: bool = False
        key_prefix: str = ""
        max_len: int = 1000
        replay_count: int = 0
        read_count: int = 500
        timeout: str = "1s"
        bootstrap_timeout: str = "5s"

        def __post_init__(self) -> None:
            parts = urlsplit(self.url)
            if parts.scheme not in ("redis", "rediss") or not parts.hostname:
                raise ValueError(
                    f"url must be redis://host[:port][/db] or rediss://…, got {self.url!r}"
                )
            if (parts.username or parts.password) and (
                self.username or self.password or self.password_file
            ):
                raise ValueError("credentials are both in url and in username/password(File)")
            if self.password and self.password_file:
                raise ValueError("password and passwordFile are mutually exclusive")
            tls_files = self.ca_file or self.cert_file or self.key_file or self.insecure_skip_verify
            if tls_files and parts.scheme != "rediss":
                raise ValueError("caFile/certFile/keyFile/insecureSkipVerify need a rediss:// url")
            if self.key_file and not self.cert_file:
                raise ValueError("keyFile needs certFile")
            for key, value, low in (
                ("maxLen", self.max_len, 1),
                ("replayCount", self.replay_count, 0),
                ("readCount", self.read_count, 1),
            ):
                if value < low:
                    raise ValueError(f"{key} must be >= {low}, got {value}")
            if parse_duration(self.timeout) <= 0:
                raise ValueError(f"timeout must be > 0, got {self.timeout!r}")
            if parse_duration(self.bootstrap_timeout) < 0:
                raise ValueError(f"bootstrapTimeout must be >= 0, got {self.bootstrap_timeout!r}")

    params: Params

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._log = handle.logger(self.typed_name)
        host = os.environ.get("POD_NAME") or socket.gethostname() or "epp"
        self._replica_id = f"{host}-{secrets.token_hex(3)}"
        self._timeout = parse_duration(params.timeout)
        self._bootstrap_timeout = parse_duration(params.bootstrap_timeout)
        self._stream = f"{params.key_prefix or 'epp:default/default'}:facts"
        self._cursor: str | None = None
        # one connection per side: a publish never waits behind a blocked XREAD
        self._clients: dict[str, Redis | None] = {"publish": None, "receive": None}
        self._last_error = ""
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(dict[str, list[Any]])
        name_ = self.typed_name.name
        bytes_total = metric_family(
            handle.registry, Counter, "llm_d_epp_redis_syncer_bytes",
            "Payload bytes of the entries this replica published and received.", _LABELS,
        )  # fmt: skip
        dropped = metric_family(
            handle.registry, Counter, "llm_d_epp_redis_syncer_dropped_entries",
            "Batches that could not be encoded and entries that could not be decoded.", _LABELS,
        )  # fmt: skip
        self._bytes = {d: bytes_total.labels(name_, d) for d in ("published", "received")}
        self._dropped = {d: dropped.labels(name_, d) for d in ("published", "received")}

    # ---- ReplicaSyncer -----------------------------------------------------------------------

    @property
    def replica_id(self) -> str:
        return self._replica_id

    @property
    def bootstrap_timeout(self) -> float:
        return self._bootstrap_timeout

    @property
    def stream(self) -> str:
        """The Redis key of this pool's log."""
        return self._stream

    def bind(self, pool: str) -> None:
        if not self.params.key_prefix:
            self._stream = f"epp:{pool}:facts"

    async def publish(self, batch: Mapping[str, Sequence[Any]]) -> None:
        try:
            payload = self._encoder.encode(batch)
        except (TypeError, ValueError, OverflowError) as exc:
            self._dropped["published"].inc()
            self._log.error("dropped a batch that cannot be encoded: %s", exc)
            return
        fields: dict[Any, Any] = {"o": self._replica_id, "f": payload}
        await self._call(
            lambda r: r.xadd(self._stream, fields, maxlen=self.params.max_len, approximate=True),
            side="publish",
        )
        self._bytes["published"].inc(len(payload))

    async def receive(self, wait: float = 0.0) -> list[Delivery]:
        if self._cursor is None:  # no replay: start at the log's current end
            newest = await self._call(self._newest("+", 1))
            self._cursor = newest[0][0].decode() if newest else START
            return []
        cursor = self._cursor
        wait = min(max(wait, 0.0), MAX_WAIT)
        block = max(1, round(wait * 1000)) if wait > 0 else None  # BLOCK 0 would wait forever

        def read(r: Redis) -> Awaitable[list[Any]]:
            pipe = r.pipeline(transaction=False)
            pipe.xread({self._stream: cursor}, count=self.params.read_count, block=block)
            pipe.xrevrange(self._stream, "+", "-", count=1)
            return pipe.execute()

        response, newest = await self._call(read, extra=wait)
        entries = response[0][1] if response else []
        if entries:
            self._cursor = entries[-1][0].decode()
        elif cursor != START and (not newest or _stream_id(newest[0][0]) < _stream_id(cursor)):
            # The log is empty or ends before the cursor: Redis restarted without persistence
            # (perhaps elsewhere, with another clock) or the key was deleted. Read it from the
            # start, so entries written now are not missed whatever their ids.
            self._log.info("the log %s was reset: reading it from the start", self._stream)
            self._cursor = START
        return self._decode(entries)

    async def replay(self) -> list[Delivery]:
        wanted = self.params.replay_count or self.params.max_len
        entries: list[Any] = []
        upper = "+"
        while len(entries) < wanted:
            count = min(REPLAY_PAGE, wanted - len(entries))
            page = await self._call(self._newest(upper, count))
            entries.extend(page)
            if len(page) < count:
                break
            upper = "(" + page[-1][0].decode()
        entries.reverse()
        self._cursor = entries[-1][0].decode() if entries else START
        return self._decode(entries)

    # ---- Lifecycle, StateDumper --------------------------------------------------------------

    async def start(self) -> None:
        """Nothing to do: the connection is made by the first call (Redis may be down now)."""

    async def stop(self) -> None:
        for side in self._clients:
            await self._drop_client(side)

    def dump_state(self) -> Mapping[str, Any]:
        parts = urlsplit(self.params.url)
        return {
            "replicaId": self._replica_id,
            "server": f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path}",
            "stream": self._stream,
            "cursor": self._cursor,
            "lastError": self._last_error,
        }

    # ---- internals ---------------------------------------------------------------------------

    def _newest(self, upper: str, count: int) -> Callable[[Redis], Awaitable[Any]]:
        """The newest ``count`` entries at or below ``upper`` (``(id`` excludes ``id``)."""
        return lambda r: r.xrevrange(self._stream, upper, "-", count=count)

    def _decode(self, entries: Sequence[Any]) -> list[Delivery]:
        out: list[Delivery] = []
        for entry_id, fields in entries:
            payload = fields.get(b"f", b"")
            origin = fields.get(b"o", b"")
            self._bytes["received"].inc(len(payload))
            try:
                out.append(Delivery(origin.decode(), self._decoder.decode(payload)))
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                self._dropped["received"].inc()
                self._log.warning("skipped entry %s of %s: %s", entry_id, self._stream, exc)
        return out

    async def _call(
        self,
        command: Callable[[Redis], Awaitable[Any]],
        *,
        side: str = "receive",
        extra: float = 0.0,
    ) -> Any:
        """Run ``command`` on the side's client under the timeout (plus ``extra`` seconds of
        waiting); on failure or cancellation drop that client and re-raise."""
        try:
            async with asyncio.timeout(self._timeout + extra):
                result = await command(self._client(side))
        except Exception as exc:
            self._last_error = f"{type(exc).__name__}: {exc}"
            await self._drop_client(side)
            raise
        except asyncio.CancelledError:  # a reply may still be on its way: never reuse the socket
            await self._drop_client(side)
            raise
        self._last_error = ""
        return result

    def _client(self, side: str) -> Redis:
        client = self._clients[side]
        if client is None:
            options = self._client_options()
            if side == "receive":  # a blocked XREAD answers after its wait
                options["socket_timeout"] = self._timeout + MAX_WAIT
            client = self._clients[side] = Redis.from_url(self.params.url, **options)
        return client

    def _client_options(self) -> dict[str, Any]:
        p = self.params
        opts: dict[str, Any] = {
            "socket_timeout": self._timeout,
            "socket_connect_timeout": self._timeout,
            "retry": Retry(NoBackoff(), 0),
            "protocol": 2,
            "max_connections": 1,
        }
        if p.password_file:
            opts["credential_provider"] = _PasswordFile(p.password_file, p.username)
        elif p.username or p.password:
            opts.update(username=p.username or None, password=p.password or None)
        if urlsplit(p.url).scheme == "rediss":
            opts.update(
                ssl_ca_certs=p.ca_file or None,
                ssl_certfile=p.cert_file or None,
                ssl_keyfile=p.key_file or None,
                ssl_cert_reqs="none" if p.insecure_skip_verify else "required",
                ssl_check_hostname=not p.insecure_skip_verify,
            )
        return opts

    async def _drop_client(self, side: str) -> None:
        client, self._clients[side] = self._clients[side], None
        if client is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._timeout):
                    await client.aclose()
