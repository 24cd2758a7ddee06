"""``redis-syncer`` against a real ``redis-server`` (the ``redis_server`` fixture)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from epp.plugin import Delivery, Lifecycle, ReplicaSyncer, StateDumper
from epp.plugin.params import ParamError, decode
from epp.plugins.sync.redis import RedisSyncer
from tests.builders import FakeHandle

POOL = "default/pool"


def make(url: str, registry: CollectorRegistry | None = None, **params: Any) -> RedisSyncer:
    handle = FakeHandle(registry=registry or CollectorRegistry())
    p = decode(RedisSyncer.Params, {"url": url, "timeout": "500ms", **params})
    s = RedisSyncer(name="redis-syncer", params=p, handle=handle)
    s.bind(POOL)
    return s


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, {"plugin_name": "redis-syncer", **labels}) or 0.0


async def test_implements_the_syncer_role_and_its_capabilities() -> None:
    s = make("redis://127.0.0.1:1")
    assert isinstance(s, ReplicaSyncer)
    assert isinstance(s, Lifecycle)
    assert isinstance(s, StateDumper)
    assert s.stream == f"epp:{POOL}:facts"
    assert s.bootstrap_timeout == 5.0


async def test_receive_delivers_each_batch_once_in_order_with_its_origin(redis_server) -> None:
    server = redis_server()
    a, b = make(server.url), make(server.url)
    assert a.replica_id != b.replica_id
    assert await b.receive() == []  # the cursor starts at the log's end
    await a.publish({"p": [1, 2], "q": [{"k": "v"}]})
    await a.publish({"p": [2**64 - 1]})
    got = await b.receive()
    assert got == [
        Delivery(a.replica_id, {"p": [1, 2], "q": [{"k": "v"}]}),
        Delivery(a.replica_id, {"p": [2**64 - 1]}),
    ]
    assert await b.receive() == []
    await asyncio.gather(a.stop(), b.stop())


async def test_first_receive_skips_what_was_published_before_it(redis_server) -> None:
    server = redis_server()
    a, b = make(server.url), make(server.url)
    await a.publish({"p": ["old"]})
    assert await b.receive() == []
    await a.publish({"p": ["new"]})
    assert [d.batch for d in await b.receive()] == [{"p": ["new"]}]


async def test_replay_returns_the_newest_entries_oldest_first_then_receive_continues(
    redis_server,
) -> None:
    server = redis_server()
    a, b = make(server.url), make(server.url, replayCount=450)
    for i in range(500):
        await a.publish({"p": [i]})
    replayed = await b.replay()  # three pages: 200, 200, 50
    assert [d.batch["p"][0] for d in replayed] == list(range(50, 500))
    await a.publish({"p": [500]})
    assert [d.batch["p"][0] for d in await b.receive()] == [500]


async def test_replay_of_an_empty_log_is_empty_and_receive_reads_from_the_start(
    redis_server,
) -> None:
    server = redis_server()
    a, b = make(server.url), make(server.url)
    assert await b.replay() == []
    await a.publish({"p": [1]})
    assert len(await b.receive()) == 1


async def test_read_count_bounds_one_receive(redis_server) -> None:
    server = redis_server()
    a, b = make(server.url), make(server.url, readCount=10)
    await b.receive()
    for i in range(25):
        await a.publish({"p": [i]})
    sizes = [len(await b.receive()) for _ in range(4)]
    assert sizes == [10, 10, 5, 0]


async def test_log_is_trimmed_to_about_max_len(redis_server) -> None:
    server = redis_server()
    a = make(server.url, maxLen=50)
    for i in range(1000):
        await a.publish({"p": [i]})
    length = server.client().xlen(a.stream)
    assert 50 <= length < 250  # MAXLEN ~ trims whole nodes (100 entries each)


async def test_pools_sharing_a_redis_do_not_see_each_other(redis_server) -> None:
    server = redis_server()
    a, b, c = make(server.url), make(server.url), make(server.url)
    b.bind("default/other-pool")
    await b.receive()
    await c.receive()
    await a.publish({"p": [1]})
    assert await b.receive() == []
    assert len(await c.receive()) == 1


async def test_key_prefix_overrides_the_pool(redis_server) -> None:
    server = redis_server()
    a, b = make(server.url, keyPrefix="shared"), make(server.url, keyPrefix="shared")
    b.bind("default/other-pool")
    assert a.stream == b.stream == "shared:facts"
    await b.receive()
    await a.publish({"p": [1]})
    assert len(await b.receive()) == 1


async def test_password_is_required_and_accepted_from_params_or_file(
    redis_server, tmp_path: Path
) -> None:
    server = redis_server("--requirepass", "s3cret")
    with pytest.raises(Exception, match=r"(?i)auth"):
        await make(server.url).publish({"p": [1]})
    await make(server.url, password="s3cret").publish({"p": [1]})
    secret = tmp_path / "password"
    secret.write_text("wrong\n")
    syncer = make(server.url, passwordFile=str(secret))
    with pytest.raises(Exception, match=r"(?i)(auth|password)"):
        await syncer.publish({"p": [2]})
    secret.write_text("s3cret\n")  # a rotated Secret: read again at the next connection
    await syncer.publish({"p": [2]})
    assert server.client(password="s3cret").xlen(syncer.stream) == 2


async def test_acl_user_authenticates_with_username_and_password(redis_server) -> None:
    least = ("~epp:*", "+xadd", "+xread", "+xrevrange")  # the ACL the docstring documents
    acl = ("--user", "epp", "on", ">pw", *least, "--user", "default", "off")
    server = redis_server(*acl)
    a = make(server.url, username="epp", password="pw", replayCount=1)
    await a.receive()
    await a.publish({"p": [1]})
    url_with_credentials = server.url.replace("redis://", "redis://epp:pw@")
    await make(url_with_credentials).publish({"p": [2]})
    assert [d.batch for d in await a.receive()] == [{"p": [1]}, {"p": [2]}]
    assert [d.batch for d in await a.replay()] == [{"p": [2]}]
    with pytest.raises(Exception, match="no permissions"):
        await make(server.url, username="epp", password="pw", keyPrefix="other").publish({})


async def test_tls_with_ca_and_client_certificate(redis_server, tmp_path: Path) -> None:
    from epp.server.tls import self_signed

    cert_pem, key_pem = self_signed("localhost")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(cert_pem)
    key.write_bytes(key_pem)
    server = redis_server(tls=(cert, cert, key))
    url = f"rediss://localhost:{server.port}/0"
    files = {"caFile": str(cert), "certFile": str(cert), "keyFile": str(key)}
    # a TLS handshake on a busy machine can take longer than make()'s 500 ms timeout
    a, b = make(url, timeout="10s", **files), make(url, timeout="10s", **files)
    await b.receive()
    await a.publish({"p": [1]})
    assert len(await b.receive()) == 1
    with pytest.raises(Exception):  # noqa: B017 - no client certificate: the handshake fails
        await make(url, caFile=str(cert)).publish({"p": [1]})
    with pytest.raises(Exception):  # noqa: B017 - the system store does not trust the server
        await make(url, certFile=str(cert), keyFile=str(key)).publish({"p": [1]})


async def test_unreachable_redis_raises_within_the_timeout() -> None:
    from epp_tools.stack.envoy import free_port

    s = make(f"redis://127.0.0.1:{free_port()}", timeout="200ms")
    for call in (s.publish({"p": [1]}), s.receive(), s.replay()):
        started = time.monotonic()
        with pytest.raises(Exception):  # noqa: B017 - any error means "unavailable"
            await call
        assert time.monotonic() - started < 1.0
    assert "Error" in s.dump_state()["lastError"]


async def test_paused_redis_times_out_then_works_again(redis_server) -> None:
    server = redis_server()
    a = make(server.url, timeout="200ms")
    await a.receive()
    server.client().execute_command("CLIENT", "PAUSE", "1000", "ALL")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await a.publish({"p": [1]})
    assert time.monotonic() - started < 0.6
    await asyncio.sleep(1.0)
    await a.publish({"p": [2]})
    assert [d.batch for d in await a.receive()] == [{"p": [2]}]


async def test_restarted_empty_redis_is_read_from_the_start(redis_server) -> None:
    server = redis_server()
    a, b = make(server.url), make(server.url)
    await b.receive()
    await a.publish({"p": [1]})
    assert len(await b.receive()) == 1
    server.kill()
    with pytest.raises(Exception):  # noqa: B017
        await b.receive()
    server.start()
    assert await b.receive() == []  # the log is empty: the cursor goes back to 0-0
    # Entries written now may carry lower ids than before the restart (another clock).
    server.client().xadd(b.stream, {"o": "other-replica", "f": b"\x81\xa1p\x91\x07"}, id="1-1")
    assert await b.receive() == [Delivery("other-replica", {"p": [7]})]


async def test_a_log_that_ends_before_the_cursor_is_read_from_the_start(redis_server) -> None:
    server = redis_server()
    a, b = make(server.url), make(server.url)
    await b.receive()
    await a.publish({"p": [1]})
    assert len(await b.receive()) == 1
    raw = server.client()
    raw.delete(b.stream)  # reset between two polls: the log restarts with lower ids
    raw.xadd(b.stream, {"o": "other-replica", "f": b"\x81\xa1p\x91\x07"}, id="1-1")
    assert await b.receive() == []  # nothing after the cursor: the cursor goes back to 0-0
    assert await b.receive() == [Delivery("other-replica", {"p": [7]})]


async def test_undecodable_entries_are_skipped_and_counted(redis_server) -> None:
    server = redis_server()
    registry = CollectorRegistry()
    a, b = make(server.url), make(server.url, registry)
    await b.receive()
    raw = server.client()
    raw.xadd(a.stream, {"o": "x", "f": b"\xc1 not msgpack"})
    raw.xadd(a.stream, {"o": "x", "f": b"\x92\x01\x02"})  # a list, not a map of lists
    await a.publish({"p": [1]})
    assert [d.batch for d in await b.receive()] == [{"p": [1]}]
    dropped = "llm_d_epp_redis_syncer_dropped_entries_total"
    assert metric(registry, dropped, direction="received") == 2
    assert metric(registry, "llm_d_epp_redis_syncer_bytes_total", direction="received") > 0


async def test_a_batch_that_cannot_be_encoded_is_dropped_not_retried(redis_server) -> None:
    server = redis_server()
    registry = CollectorRegistry()
    a = make(server.url, registry)
    await a.publish({"p": [2**70]})
    await a.publish({"p": [object()]})
    assert server.client().exists(a.stream) == 0
    dropped = "llm_d_epp_redis_syncer_dropped_entries_total"
    assert metric(registry, dropped, direction="published") == 2


def test_replica_id_is_the_pod_name_with_a_random_suffix(monkeypatch) -> None:
    monkeypatch.setenv("POD_NAME", "epp-7d9f-abcde")
    a, b = make("redis://127.0.0.1:1"), make("redis://127.0.0.1:1")
    assert a.replica_id.startswith("epp-7d9f-abcde-")
    assert a.replica_id != b.replica_id
    assert a.replica_id == a.replica_id  # stable for the instance


def test_bind_is_ignored_when_key_prefix_is_set() -> None:
    s = make("redis://127.0.0.1:1", keyPrefix="team-a")
    s.bind("ns/pool")
    assert s.stream == "team-a:facts"


def test_dump_state_never_shows_credentials() -> None:
    s = make("redis://user:hunter2@10.0.0.5:6380/2")
    state = s.dump_state()
    assert state["server"] == "redis://10.0.0.5:6380/2"
    assert "hunter2" not in str(state)


@pytest.mark.parametrize(
    "params",
    [
        pytest.param({"url": "http://redis:6379"}, id="scheme"),
        pytest.param({"url": "redis://"}, id="no-host"),
        pytest.param({"password": "a", "passwordFile": "/p"}, id="two-passwords"),
        pytest.param({"url": "redis://u:p@h:1", "password": "a"}, id="credentials-twice"),
        pytest.param({"caFile": "/ca.pem"}, id="tls-files-without-rediss"),
        pytest.param({"url": "rediss://h:1", "keyFile": "/k.pem"}, id="key-without-cert"),
        pytest.param({"maxLen": 0}, id="max-len"),
        pytest.param({"readCount": 0}, id="read-count"),
        pytest.param({"replayCount": -1}, id="replay-count"),
        pytest.param({"timeout": "0s"}, id="timeout-zero"),
        pytest.param({"timeout": "soon"}, id="timeout-syntax"),
        pytest.param({"bootstrapTimeout": "-1s"}, id="bootstrap-negative"),
    ],
)
def test_params_rejected_when_invalid(params: dict[str, Any]) -> None:
    with pytest.raises((ParamError, ValueError)):
        decode(RedisSyncer.Params, {"url": "redis://127.0.0.1:6379", **params})
