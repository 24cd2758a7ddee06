"""Running fuzz cases against one EPP, and the checks around a run (``epp bench fuzz``,
``tests/fuzz``).

* ``run_cases``: cases ``start .. start+count-1`` of a seed, ``concurrency`` streams at a time on
  one channel (one HTTP/2 connection, as Envoy uses), tallied by verdict. Case ``i`` is drawn
  from ``random.Random(f"{seed}/{i}")``, so any case replays alone.
* ``routing_check``: well-formed chat requests (with spoofed control headers) must be routed to a
  pool endpoint, with the body forwarded intact, its ``content-length`` set and the spoofed
  headers removed, and their responses must pass back.
* ``unknown_models``: complete exchanges for ``count`` distinct model names nobody serves, each
  answered 404 by the "model server" as vLLM does.
* ``ErrorLog``: ERROR records logged while it is installed (an exception the EPP caught and
  logged is a crash too, even when the stream got a clean answer).
* ``fuzz_config_body``: the built-in default config plus every built-in parser, so every path the
  generator uses reaches a parser (count_tokens included).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import grpc
import yaml

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.config.schema import DEFAULT_CONFIG_TEXT
from epp.plugin import wire
from epp_tools.bench.fuzz.drive import VERDICTS, Result, Timeouts, drive
from epp_tools.bench.fuzz.gen import SPOOF_HOST, Case, Spec, send
from epp_tools.bench.fuzz.mutate import make_case

DEFAULT_TIMEOUTS: Final = Timeouts()
PARSERS: Final = ("openai-parser", "anthropic-parser", "vllmhttp-parser", "passthrough-parser")


def fuzz_config_body() -> str:
    """The built-in default config with every built-in parser (passthrough as the fallback),
    without ``apiVersion``/``kind``."""
    doc = yaml.safe_load(DEFAULT_CONFIG_TEXT)
    doc.pop("apiVersion", None)
    doc.pop("kind", None)
    doc["plugins"] += [{"type": name} for name in PARSERS]
    doc["requestHandler"] = {"parsers": [{"pluginRef": name} for name in PARSERS]}
    return str(yaml.safe_dump(doc, sort_keys=False))


@dataclass
class Tally:
    verdicts: Counter[str] = field(default_factory=Counter)
    tags: Counter[str] = field(default_factory=Counter)
    failures: list[dict[str, Any]] = field(default_factory=list)
    keep: int = 5  # examples kept per verdict

    def add(self, index: int, case: Case, result: Result) -> None:
        self.verdicts[result.verdict] += 1
        self.tags.update(case.tags)
        kept = sum(1 for f in self.failures if f["verdict"] == result.verdict)
        if result.verdict != "ok" and kept < self.keep:
            self.failures.append(
                {
                    "case": index,
                    "verdict": result.verdict,
                    "detail": result.detail,
                    "status": result.status,
                    "tags": case.tags,
                    "steps": [s.note or s.action for s in case.steps],
                    "replies": result.kinds,
                }
            )

    @property
    def failed(self) -> int:
        return sum(n for verdict, n in self.verdicts.items() if verdict != "ok")

    def summary(self) -> dict[str, Any]:
        return {
            "sequences": sum(self.verdicts.values()),
            **{verdict: self.verdicts.get(verdict, 0) for verdict in VERDICTS},
            "failures": self.failures,
        }


def case_rng(seed: int, index: int) -> random.Random:
    return random.Random(f"{seed}/{index}")


async def run_cases(
    channel: grpc.aio.Channel,
    spec: Spec,
    *,
    seed: int,
    count: int,
    start: int = 0,
    concurrency: int = 16,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    tally: Tally | None = None,
) -> Tally:
    tally = tally if tally is not None else Tally()
    indices = iter(range(start, start + count))

    async def worker() -> None:
        for index in indices:
            case = make_case(case_rng(seed, index), spec)
            tally.add(index, case, await drive(channel, case, spec.pool, timeouts))

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return tally


class ErrorLog(logging.Handler):
    """Counts ERROR records (and keeps the first few) while installed on the root logger."""

    def __init__(self, keep: int = 5) -> None:
        super().__init__(logging.ERROR)
        self.count = 0
        self.first: list[str] = []
        self._keep = keep

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.first) < self._keep:
            self.first.append(f"{record.name}: {record.getMessage()[:300]}")

    def __enter__(self) -> ErrorLog:
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger().removeHandler(self)


def _exchange(model: str, status: str, *, spoof: bool, body_text: str = "hi") -> tuple[Case, bytes]:
    """One complete conforming FULL_DUPLEX exchange for ``model``; returns it and its body."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": body_text}]})
    raw = body.encode()
    headers = [(":path", "/v1/chat/completions"), (":method", "POST")]
    if spoof:
        headers += [(wire.DESTINATION_HEADER, SPOOF_HOST), ("X-Prefiller-Host-Port", SPOOF_HOST)]
    header_map = pb.HeaderMap(
        headers=[pb.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers]
    )
    answer = json.dumps({"model": model, "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    if not status.startswith("2"):
        answer = json.dumps({"error": {"message": f"The model `{model}` does not exist."}})
    response_headers = pb.HeaderMap(
        headers=[
            pb.HeaderValue(key=":status", raw_value=status.encode()),
            pb.HeaderValue(key="content-type", raw_value=b"application/json"),
        ]
    )
    steps = [
        send(pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=header_map)), "headers"),
        send(pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=True)), "body"),
        send(
            pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=response_headers)),
            "response_headers",
        ),
        send(
            pb.ProcessingRequest(
                response_body=pb.HttpBody(body=answer.encode(), end_of_stream=True)
            ),
            "response_body",
        ),
    ]
    spoofed = {wire.DESTINATION_HEADER: SPOOF_HOST, "x-prefiller-host-port": SPOOF_HOST}
    return Case(steps=steps, spoofed=spoofed if spoof else {}), raw


def _routing_problem(result: Result, body: bytes, pool: Sequence[str]) -> str | None:
    if result.verdict != "ok":
        return f"{result.verdict}: {result.detail}"
    kinds = result.kinds
    if not kinds or kinds[0] != "request_headers" or kinds[-1] != "response_body":
        return f"replies {kinds}"
    mutation = result.replies[0].request_headers.response.header_mutation
    sets = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
    if sets.get(wire.DESTINATION_HEADER) not in pool:
        return f"destination {sets.get(wire.DESTINATION_HEADER)!r} is not a pool endpoint"
    if sets.get("content-length") != str(len(body)):
        return f"content-length {sets.get('content-length')!r}, body is {len(body)} bytes"
    forwarded = b"".join(
        r.request_body.response.body_mutation.streamed_response.body
        for r in result.replies
        if r.WhichOneof("response") == "request_body"
    )
    if forwarded != body:
        return "the forwarded body differs from the client's"
    return None


async def routing_check(
    channel: grpc.aio.Channel,
    spec: Spec,
    *,
    requests: int = 20,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
) -> tuple[bool, str, Counter[str]]:
    """``(ok, first problem, destinations)`` over ``requests`` well-formed requests."""
    destinations: Counter[str] = Counter()
    for i in range(requests):
        case, body = _exchange(spec.served_models[0], "200", spoof=True, body_text=f"q{i}")
        result = await drive(channel, case, spec.pool, timeouts)
        problem = _routing_problem(result, body, spec.pool)
        if problem is not None:
            return False, f"request {i}: {problem}", destinations
        mutation = result.replies[0].request_headers.response.header_mutation
        destinations.update(
            h.header.raw_value.decode()
            for h in mutation.set_headers
            if h.header.key == wire.DESTINATION_HEADER
        )
    return True, "", destinations


async def unknown_models(
    channel: grpc.aio.Channel,
    spec: Spec,
    *,
    count: int,
    seed: int = 1,
    concurrency: int = 16,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
) -> Counter[str]:
    """Complete exchanges for ``count`` distinct unserved model names; verdicts counted."""
    verdicts: Counter[str] = Counter()
    indices = iter(range(count))
    salt = random.Random(seed).getrandbits(32)

    async def worker() -> None:
        for i in indices:
            case, _ = _exchange(f"unknown-{salt:08x}-{i}", "404", spoof=False)
            verdicts[(await drive(channel, case, spec.pool, timeouts)).verdict] += 1

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return verdicts
