"""Protocol mutations of a generated exchange, and where it ends (``epp bench fuzz``).

``make_case(rng, spec)`` is the fuzzer's unit: a conforming exchange from ``fuzz_gen.generate``,
in half of the cases broken by one to three mutations (a mutated case is no longer ``legal``),
and in a fifth of them cut short by the data plane: a half-close or a cancel at a random point
(what Envoy does when the client goes away).

Mutations: ``drop``, ``duplicate``, ``swap`` (neighbours), ``move`` (anywhere), ``empty`` (a
``ProcessingRequest`` with no ``request`` field, sometimes carrying metadata or a protocol
config), ``stray`` (a message of any of the six kinds anywhere), ``second-request`` (request
headers and body again), ``response-first`` (the response phase before the request),
``mode-flip`` (a ``protocol_config`` on a later message), ``raw-random`` (random bytes),
``raw-truncated`` (a message cut short), ``raw-bad-utf8`` (invalid UTF-8 in a header name, a
proto3 ``string``), ``deep-metadata`` (a Struct nested deeper than the decoder's limit).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Final

from epp._proto import epp_extproc_v3_pb2 as pb
from epp_tools.bench.fuzz.gen import (
    CANCEL,
    DUPLEX,
    HALF_CLOSE,
    MODE,
    SEND,
    Case,
    Spec,
    Step,
    generate,
    response_phase,
    send,
    with_metadata,
)

_MARKER: Final = b"KEYMARK1"
_BAD_UTF8: Final = b"\xff\xfe\xfd\xc3\x28\xa0\xa1\xe2"


def _pos(rng: random.Random, case: Case, extra: int = 0) -> int:
    return rng.randrange(len(case.steps) + extra) if case.steps or extra else 0


def _drop(rng: random.Random, case: Case, spec: Spec) -> None:
    if case.steps:
        del case.steps[_pos(rng, case)]


def _duplicate(rng: random.Random, case: Case, spec: Spec) -> None:
    if case.steps:
        i = _pos(rng, case)
        case.steps.insert(i, case.steps[i])


def _swap(rng: random.Random, case: Case, spec: Spec) -> None:
    if len(case.steps) > 1:
        i = rng.randrange(len(case.steps) - 1)
        case.steps[i], case.steps[i + 1] = case.steps[i + 1], case.steps[i]


def _move(rng: random.Random, case: Case, spec: Spec) -> None:
    if case.steps:
        step = case.steps.pop(_pos(rng, case))
        case.steps.insert(_pos(rng, case, 1), step)


def _empty(rng: random.Random, case: Case, spec: Spec) -> None:
    msg = pb.ProcessingRequest()
    if rng.random() < 0.3:
        with_metadata(msg, "envoy.lb", {"k": "v"})
    if rng.random() < 0.3:
        msg.protocol_config.request_body_mode = DUPLEX
    case.steps.insert(_pos(rng, case, 1), send(msg, "empty"))


def _stray(rng: random.Random, case: Case, spec: Spec) -> None:
    eos = rng.random() < 0.5
    msg = rng.choice(
        (
            pb.ProcessingRequest(request_headers=pb.HttpHeaders(end_of_stream=eos)),
            pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}", end_of_stream=eos)),
            pb.ProcessingRequest(request_trailers=pb.HttpTrailers()),
            pb.ProcessingRequest(response_headers=pb.HttpHeaders(end_of_stream=eos)),
            pb.ProcessingRequest(response_body=pb.HttpBody(body=b"x", end_of_stream=eos)),
            pb.ProcessingRequest(response_trailers=pb.HttpTrailers()),
        )
    )
    case.steps.insert(_pos(rng, case, 1), send(msg, f"stray {msg.WhichOneof('request')}"))


def _second_request(rng: random.Random, case: Case, spec: Spec) -> None:
    again = generate(rng, spec)
    request = [s for s in again.steps if not s.note.startswith("response")]
    at = _pos(rng, case, 1)
    case.steps[at:at] = request


def _response_first(rng: random.Random, case: Case, spec: Spec) -> None:
    case.steps[0:0] = response_phase(rng, DUPLEX, spec)


def _mode_flip(rng: random.Random, case: Case, spec: Spec) -> None:
    if len(case.steps) < 2:
        return
    i = rng.randrange(1, len(case.steps))
    msg = pb.ProcessingRequest()
    try:
        msg.ParseFromString(case.steps[i].data)
    except Exception:
        return
    msg.protocol_config.request_body_mode = rng.choice((MODE.BUFFERED, MODE.STREAMED, MODE.NONE))
    case.steps[i] = send(msg, case.steps[i].note + " +mode-flip")


def _raw_random(rng: random.Random, case: Case, spec: Spec) -> None:
    data = rng.randbytes(rng.randint(1, 300))
    case.steps.insert(_pos(rng, case, 1), Step(SEND, data, "raw random"))


def _raw_truncated(rng: random.Random, case: Case, spec: Spec) -> None:
    if case.steps:
        i = _pos(rng, case)
        data = case.steps[i].data
        case.steps[i] = Step(SEND, data[: rng.randrange(len(data))] if data else b"\xff", "cut")


def _raw_bad_utf8(rng: random.Random, case: Case, spec: Spec) -> None:
    header = pb.HeaderValue(key=_MARKER.decode(), raw_value=b"v")
    msg = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=pb.HeaderMap(headers=[header]))
    )
    data = msg.SerializeToString().replace(_MARKER, _BAD_UTF8)
    case.steps.insert(_pos(rng, case, 1), Step(SEND, data, "raw bad utf-8"))


def _deep_metadata(rng: random.Random, case: Case, spec: Spec) -> None:
    value: dict[str, object] = {"leaf": 1}
    for _ in range(rng.choice((120, 400))):
        value = {"a": value}
    msg = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}", end_of_stream=True))
    with_metadata(msg, "envoy.lb.subset_hint", {"x": value})
    case.steps.insert(_pos(rng, case, 1), send(msg, "deep metadata"))


MUTATIONS: Final[dict[str, Callable[[random.Random, Case, Spec], None]]] = {
    "drop": _drop,
    "duplicate": _duplicate,
    "swap": _swap,
    "move": _move,
    "empty": _empty,
    "stray": _stray,
    "second-request": _second_request,
    "response-first": _response_first,
    "mode-flip": _mode_flip,
    "raw-random": _raw_random,
    "raw-truncated": _raw_truncated,
    "raw-bad-utf8": _raw_bad_utf8,
    "deep-metadata": _deep_metadata,
}


def make_case(rng: random.Random, spec: Spec, *, mutate: float = 0.5) -> Case:
    """A generated exchange, mutated with probability ``mutate``, maybe cut short."""
    case = generate(rng, spec)
    if rng.random() < mutate:
        case.legal = False
        for name in rng.sample(sorted(MUTATIONS), rng.choice((1, 1, 1, 2, 3))):
            MUTATIONS[name](rng, case, spec)
            case.tags.append(name)
    roll = rng.random()
    if roll < 0.2 and case.steps:
        at = rng.randrange(len(case.steps) + 1)
        action = CANCEL if roll < 0.1 else HALF_CLOSE
        case.steps[at:] = [Step(action, note=action)]
        case.tags.append(action)
    return case
