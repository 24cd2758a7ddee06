"""The ext_proc stream under seeded random and adversarial message sequences (a short run; the
long one is ``epp bench fuzz``). Every sequence must end in a reply or a clean error, never in
silence; no client-sent control header may pass; nothing may be left counted as running; the EPP
must route correctly afterwards. ``EPP_FUZZ_SEED`` / ``EPP_FUZZ_SEQUENCES`` change the run."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.plugin import wire
from epp_tools.bench.fuzz.drive import Timeouts, drive
from epp_tools.bench.fuzz.gen import CANCEL, HALF_CLOSE, SEND, SPOOF_HOST, Case, Step
from epp_tools.bench.fuzz.run import ErrorLog, routing_check, run_cases
from tests.fuzz.conftest import FuzzTarget

MODE = pb.ProcessingMode
SEED = int(os.environ.get("EPP_FUZZ_SEED", "1"))
SEQUENCES = int(os.environ.get("EPP_FUZZ_SEQUENCES", "400"))


# A silent stream is one that outlasts these; on a busy machine an honest reply can take
# seconds, so they bound a failure only (the benchmark's long run keeps the 2 s default).
PATIENT = Timeouts(reply=20.0, end=30.0)


async def settled(target: FuzzTarget, limit: float = 30.0) -> None:
    """Wait (bounded) until no request is counted as running."""
    async with asyncio.timeout(limit):
        while running(target):
            await asyncio.sleep(0.05)


def running(target: FuzzTarget) -> float:
    families = target.app.metrics.registry.collect()
    return sum(
        s.value
        for family in families
        if family.name == "llm_d_epp_request_running"
        for s in family.samples
    )


async def test_seeded_sequences_end_in_a_reply_or_a_clean_error(fuzz_target: FuzzTarget) -> None:
    with ErrorLog() as errors:
        tally = await run_cases(
            fuzz_target.channel,
            fuzz_target.spec,
            seed=SEED,
            count=SEQUENCES,
            concurrency=16,
            timeouts=PATIENT,
        )
    assert tally.failed == 0, tally.failures
    assert errors.count == 0, errors.first
    assert sum(tally.verdicts.values()) == SEQUENCES
    await settled(fuzz_target)  # cancelled streams finish on the server side
    ok, problem, destinations = await routing_check(fuzz_target.channel, fuzz_target.spec)
    assert ok, problem
    assert len(destinations) > 1  # still spreading over the pool
    assert running(fuzz_target) == 0
    misuse = fuzz_target.app.metrics.registry.get_sample_value(
        "llm_d_epp_extproc_protocol_errors_total", {"reason": "undecodable"}
    )
    assert misuse  # the run did exercise protocol misuse


# Hypothesis explores the *order* of messages (content stays plain), so a failure shrinks to the
# shortest sequence of kinds that shows it.
KINDS = (
    "request_headers",
    "request_headers eos",
    "request_body",
    "request_body eos",
    "request_trailers",
    "response_headers",
    "response_headers eos",
    "response_body",
    "response_body eos",
    "response_trailers",
    "empty",
    "garbage",
)
CONFORMING = ("request_headers", "request_body eos", "response_headers", "response_body eos")
MODES = (None, MODE.FULL_DUPLEX_STREAMED, MODE.BUFFERED, MODE.STREAMED, MODE.NONE)
CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
HEADERS = {":path": "/v1/chat/completions", "x-gateway-destination-endpoint": SPOOF_HOST}


def message(kind: str) -> bytes:
    name, _, eos = kind.partition(" ")
    if name == "empty":
        return b""  # a ProcessingRequest with no field set serializes to nothing
    if name == "garbage":
        return b"\xff\x00\xfe"
    if name in ("request_headers", "response_headers"):
        pairs = HEADERS if name == "request_headers" else {":status": "200"}
        headers = pb.HeaderMap(
            headers=[pb.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
        )
        value: Any = pb.HttpHeaders(headers=headers, end_of_stream=bool(eos))
    elif name in ("request_body", "response_body"):
        value = pb.HttpBody(body=CHAT if name == "request_body" else b"{}", end_of_stream=bool(eos))
    else:
        value = pb.HttpTrailers()
    return pb.ProcessingRequest(**{name: value}).SerializeToString()


@settings(
    max_examples=int(os.environ.get("EPP_FUZZ_EXAMPLES", "80")),
    deadline=None,
    database=None,
    derandomize=not os.environ.get("EPP_FUZZ_RANDOM"),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    prefix=st.integers(0, len(CONFORMING)),
    tail=st.lists(st.sampled_from(KINDS), min_size=1, max_size=8),
    mode=st.sampled_from(MODES),
    end=st.sampled_from((HALF_CLOSE, CANCEL)),
)
async def test_messages_in_any_order_are_answered(
    fuzz_target: FuzzTarget, prefix: int, tail: list[str], mode: int | None, end: str
) -> None:
    kinds = [*CONFORMING[:prefix], *tail]  # a conforming start, then anything
    steps = [Step(SEND, message(kind), kind) for kind in kinds]
    if mode is not None and kinds[0] not in ("empty", "garbage"):
        first = pb.ProcessingRequest.FromString(steps[0].data)
        first.protocol_config.request_body_mode = mode
        first.protocol_config.response_body_mode = mode
        steps[0] = Step(SEND, first.SerializeToString(), kinds[0])
    spoofed = {wire.DESTINATION_HEADER: SPOOF_HOST}
    case = Case(steps=[*steps, Step(end)], spoofed=spoofed, legal=False)
    result = await drive(fuzz_target.channel, case, fuzz_target.spec.pool, PATIENT)
    assert result.verdict == "ok", (result.detail, result.status, result.kinds)
