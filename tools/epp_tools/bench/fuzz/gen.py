"""Seeded ext_proc message sequences for ``epp bench fuzz`` (and ``tests/fuzz``).

``generate(rng, spec)`` builds one ``Case``: what a data plane sends on one ext_proc stream. It
starts from a conforming exchange (one of the body modes, a request with headers, body chunks
and maybe trailers, then a response phase) filled with adversarial *content*: odd paths, bodies
that do not parse, deeply nested or wrongly typed JSON, non-UTF-8 bytes, bodies over the limit,
model names nobody serves, huge and duplicate headers, spoofed control headers (every
``wire.OWNED_REQUEST_HEADERS`` name, in any letter case), odd subset hints. Half of the cases
then get *protocol* mutations (``fuzz_mutate``): messages dropped, duplicated, swapped or
reordered, empty messages, stray messages of any kind, a second request, bytes that are not a
``ProcessingRequest`` (random, truncated, invalid UTF-8 in a string field, metadata nested past
the decoder's depth limit). Any case may end early in a half-close or a cancel.

Everything is drawn from the ``random.Random`` given, so a seed reproduces a case exactly; a
Hypothesis ``randoms()`` strategy works too (``tests/fuzz``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from google.protobuf import struct_pb2

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.plugin import wire

MODE = pb.ProcessingMode
BodyMode: TypeAlias = pb.ProcessingMode.BodySendMode
DUPLEX: Final = MODE.FULL_DUPLEX_STREAMED
SEND: Final = "send"
HALF_CLOSE: Final = "half_close"
CANCEL: Final = "cancel"
SPOOF_HOST: Final = "10.66.66.66:6666"

_PATHS: Final = (
    ("/v1/chat/completions", "chat"),
    ("/v1/completions", "completions"),
    ("/v1/responses", "responses"),
    ("/v1/embeddings", "embeddings"),
    ("/v1/messages", "anthropic"),
    ("/v1/messages/count_tokens", "count"),
    ("/inference/v1/generate", "generate"),
    ("/v1/chat/completions?x=1", "chat"),
    ("/no/such/api", "completions"),
    ("", "completions"),
)
_CLOSES_AFTER_REQUEST: Final = frozenset({"count"})


@dataclass(frozen=True, slots=True)
class Spec:
    """What the generator needs to know of the EPP under test."""

    pool: tuple[str, ...]  # host:port of every endpoint
    served_models: tuple[str, ...] = ("sim-model",)
    max_body: int = 256 << 10


@dataclass(slots=True)
class Step:
    action: str  # SEND, HALF_CLOSE or CANCEL
    data: bytes = b""  # a serialized ProcessingRequest, or bytes that are not one
    note: str = ""


@dataclass(slots=True)
class Case:
    steps: list[Step]
    spoofed: dict[str, str] = field(default_factory=dict)  # owned header -> client's value
    tags: list[str] = field(default_factory=list)
    legal: bool = True  # a conforming data plane could send exactly this sequence
    may_close: bool = False  # the request skips response processing (the EPP closes)
    model: str = ""


def send(msg: pb.ProcessingRequest, note: str) -> Step:
    return Step(SEND, msg.SerializeToString(), note)


# ---- content ------------------------------------------------------------------------------------


def model_name(rng: random.Random, spec: Spec) -> Any:
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(spec.served_models)
    if roll < 0.8:
        return f"fz-{rng.getrandbits(48):012x}"  # a fresh name nobody serves
    return rng.choice(
        [
            "",
            "m" * rng.choice((257, 5000, 100_000)),
            "模型-\u202e-\x00-名",
            "fz-\udcff",  # a lone surrogate: invalid UTF-8 once encoded
            123,
            None,
            ["a"],
            {"x": 1},
            True,
        ]
    )


def _payload(rng: random.Random, api: str, model: Any) -> dict[str, Any]:
    text = rng.choice(("hi", "hello there " * rng.randint(1, 50), "é\u0000\ufffd"))
    if api in ("chat", "anthropic", "count"):
        body: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
        if api == "anthropic":
            body["max_tokens"] = rng.randint(1, 16)
    elif api == "responses":
        body = {"input": text}
    elif api == "embeddings":
        body = {"input": [text]}
    elif api == "generate":
        body = {"token_ids": [rng.randint(0, 500) for _ in range(rng.randint(1, 20))]}
    else:
        body = {"prompt": text, "max_tokens": rng.randint(1, 16)}
    body["model"] = model
    if rng.random() < 0.3:
        body["stream"] = rng.choice((True, False, "yes", 1, None))
    if rng.random() < 0.1:
        body[rng.choice(("messages", "prompt", "input", "max_tokens"))] = rng.choice(
            ("str", 5, [1, 2], {"a": None}, None, [])
        )
    return body


def body_bytes(rng: random.Random, api: str, spec: Spec) -> tuple[bytes, str, str]:
    """A request body, what kind it is (for the report) and its model name if any."""
    model = model_name(rng, spec)
    roll = rng.random()
    if roll < 0.6:
        text = json.dumps(_payload(rng, api, model), ensure_ascii=rng.random() < 0.5)
        return text.encode("utf-8", "surrogatepass"), "json", str(model)
    if roll < 0.65:
        return b"x" * (spec.max_body + rng.randint(1, 5000)), "over-limit", ""
    depth = rng.choice((50, 1000, 20_000))
    kind, data = rng.choice(
        [
            ("garbage", rng.randbytes(rng.randint(1, 2000))),
            ("truncated", json.dumps(_payload(rng, api, model)).encode()[: rng.randint(0, 40)]),
            ("nested", b'{"model":"m","messages":' + b"[" * depth + b"]" * depth + b"}"),
            ("nested-obj", b'{"a":' * depth + b"1" + b"}" * depth),
            ("non-utf8", b'{"model":"\xff\xfe","prompt":"\xc3\x28"}'),
            ("empty", b""),
            ("scalar", rng.choice((b"null", b"1", b'"s"', b"[]", b"true"))),
            ("dup-keys", b'{"model":"a","model":"b","prompt":"p","prompt":1}'),
            ("big", json.dumps(_payload(rng, api, "x" * 200_000)).encode()),
        ]
    )
    return data, kind, str(model) if kind == "truncated" else ""


def _header(key: str, value: str | bytes, rng: random.Random) -> pb.HeaderValue:
    raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
    if isinstance(value, str) and rng.random() < 0.1:
        return pb.HeaderValue(key=key, value=value)  # old Envoys fill ``value``
    return pb.HeaderValue(key=key, raw_value=raw)


def _spoof_case(name: str, rng: random.Random) -> str:
    return rng.choice((name, name.upper(), name.title(), name.swapcase()))


def request_headers(rng: random.Random, path: str, case: Case, spec: Spec) -> list[pb.HeaderValue]:
    pairs: list[tuple[str, str | bytes]] = [(":method", "POST"), (":authority", "fuzz")]
    if path:
        pairs.append((":path", path))
    if rng.random() < 0.8:
        request_id = rng.choice((f"fz-{rng.getrandbits(32)}", "", "x" * 5000))
        pairs.append((wire.REQUEST_ID_HEADER, request_id))
    if rng.random() < 0.4:
        for name in rng.sample(wire.OWNED_REQUEST_HEADERS, rng.randint(1, 3)):
            value = rng.choice((SPOOF_HOST, rng.choice(spec.pool), "a,b", ""))
            if value:
                case.spoofed[name] = value
            pairs.append((_spoof_case(name, rng), value))
    if rng.random() < 0.3:
        control = rng.choice(
            (*wire.FAIRNESS_HEADERS, *wire.OBJECTIVE_HEADERS, *wire.MODEL_REWRITE_HEADERS)
        )
        pairs.append((control, rng.choice((f"t-{rng.getrandbits(40)}", "ü" * 300, "", "x" * 9000))))
    if rng.random() < 0.1:
        pairs += [("x-dup", str(i)) for i in range(rng.choice((2, 50)))]
    if rng.random() < 0.05:
        pairs += [(f"x-h{i}", "v" * rng.choice((10, 1000))) for i in range(rng.choice((100, 500)))]
    if rng.random() < 0.05:
        pairs.append(("x-bin", bytes(rng.randbytes(64))))
    if rng.random() < 0.05:
        pairs.append(("x-epp-explain", "true"))
    if rng.random() < 0.03:
        pairs.append(("prefer", "if-available"))
    rng.shuffle(pairs)
    return [_header(k, v, rng) for k, v in pairs]


def subset_hint(rng: random.Random, spec: Spec) -> Any:
    return rng.choice(
        [
            list(spec.pool),
            [rng.choice(spec.pool)],
            [],
            ["garbage", "1.2.3.4:5", "[::1]:80", ""],
            "10.0.0.1:8000",
            42,
            {"nested": {"deeper": [1, 2]}},
            [1, None, True, {"a": "b"}],
            [f"10.{i // 250}.{i % 250}.1:80" for i in range(5000)],
        ]
    )


def with_metadata(msg: pb.ProcessingRequest, namespace: str, values: dict[str, Any]) -> None:
    st = struct_pb2.Struct()
    st.update(values)
    msg.metadata_context.filter_metadata[namespace].CopyFrom(st)


def chunks(data: bytes, rng: random.Random) -> list[bytes]:
    if not data or rng.random() < 0.5:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data) + 1), min(len(data), rng.randint(1, 5))))
    out, last = [], 0
    for cut in cuts:
        out.append(data[last:cut])
        last = cut
    if last < len(data):
        out.append(data[last:])
    return out


# ---- a conforming exchange ----------------------------------------------------------------------


def _modes(rng: random.Random) -> tuple[BodyMode | None, BodyMode]:
    request = rng.choices(
        (DUPLEX, MODE.BUFFERED, MODE.STREAMED, MODE.BUFFERED_PARTIAL, MODE.NONE, None),
        weights=(60, 15, 5, 3, 5, 12),
    )[0]
    response = rng.choices((DUPLEX, MODE.BUFFERED, MODE.STREAMED, MODE.NONE), (70, 15, 5, 10))[0]
    return request, response if request is not None else DUPLEX


def generate(rng: random.Random, spec: Spec) -> Case:
    """One conforming exchange with adversarial content (see the module docstring)."""
    case = Case(steps=[])
    req_mode, resp_mode = _modes(rng)
    path, api = rng.choice(_PATHS)
    header_only = rng.random() < 0.1
    msg = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=pb.HeaderMap(headers=request_headers(rng, path, case, spec)),
            end_of_stream=header_only,
        )
    )
    if req_mode is not None:
        msg.protocol_config.request_body_mode = req_mode
        msg.protocol_config.response_body_mode = resp_mode
    if rng.random() < 0.15:
        ns = wire.SUBSET_NAMESPACE if rng.random() < 0.9 else wire.LB_NAMESPACE
        with_metadata(msg, ns, {wire.SUBSET_KEY: subset_hint(rng, spec)})
    case.steps.append(send(msg, "request_headers"))
    mode = DUPLEX if req_mode is None else req_mode
    name = "header-only" if header_only else MODE.BodySendMode.Name(mode)
    case.tags.append(f"{api}/{name}{'' if req_mode is not None else '(no protocol_config)'}")
    if not header_only and req_mode != MODE.NONE:
        body, kind, case.model = body_bytes(rng, api, spec)
        case.tags.append(kind)
        case.steps += _body_steps(rng, body, mode)
    case.may_close = api in _CLOSES_AFTER_REQUEST  # routed, the EPP closes the stream
    if rng.random() < 0.8:
        case.steps += response_phase(rng, resp_mode, spec)
    return case


def _body_steps(rng: random.Random, body: bytes, mode: int) -> list[Step]:
    trailers = rng.random() < 0.1
    pieces = chunks(body, rng) if mode in (DUPLEX, MODE.STREAMED) else [body]
    steps = [
        send(
            pb.ProcessingRequest(
                request_body=pb.HttpBody(
                    body=piece, end_of_stream=i == len(pieces) - 1 and not trailers
                )
            ),
            "request_body",
        )
        for i, piece in enumerate(pieces)
    ]
    if trailers:
        steps.append(send(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()), "trailers"))
    return steps


def _response_body(rng: random.Random, sse: bool, model: str) -> bytes:
    usage: dict[str, Any] = {
        "prompt_tokens": rng.choice((7, 0, -1, 10**30, "x", None)),
        "completion_tokens": rng.choice((3, 0, 2**64, "3")),
        "prompt_tokens_details": rng.choice(({"cached_tokens": 2}, None, [], "x")),
    }
    doc = {"id": f"resp-{rng.getrandbits(32)}", "model": model, "usage": usage}
    if sse:
        events = [json.dumps({"model": model, "choices": [{"text": "a"}]})] * rng.randint(0, 5)
        events += [json.dumps(doc), "[DONE]"]
        return "".join(f"data: {e}\n\n" for e in events).encode()
    return rng.choice(
        (json.dumps(doc).encode(), b"", rng.randbytes(rng.randint(1, 500)), b"{" * 5000)
    )


def response_phase(rng: random.Random, mode: int, spec: Spec) -> list[Step]:
    """Response headers (unless ``response_header_mode: SKIP``), body chunks, maybe trailers."""
    sse = rng.random() < 0.3
    status = rng.choice(("200",) * 6 + ("404", "500", "503", "abc", "", "99999"))
    content_type = "text/event-stream" if sse else "application/json"
    eos = rng.random() < 0.05
    msg = pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=pb.HeaderMap(
                headers=[
                    _header(":status", status, rng),
                    _header("content-type", content_type, rng),
                ]
            ),
            end_of_stream=eos,
        )
    )
    if rng.random() < 0.7:
        served = rng.choice((*spec.pool, "garbage", ""))
        with_metadata(msg, wire.LB_NAMESPACE, {wire.SERVED_HEADER: served})
    steps = [] if rng.random() < 0.05 else [send(msg, "response_headers")]
    if (eos and steps) or mode == MODE.NONE:
        return steps
    body = _response_body(rng, sse, rng.choice(spec.served_models))
    trailers = rng.random() < 0.1
    pieces = chunks(body, rng) if mode in (DUPLEX, MODE.STREAMED) else [body]
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1 and not trailers
        chunk = pb.HttpBody(body=piece, end_of_stream=last)
        steps.append(send(pb.ProcessingRequest(response_body=chunk), "response_body"))
    if trailers:
        steps.append(send(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()), "trailers"))
    return steps
