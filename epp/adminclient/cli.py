"""``epp explain``, ``epp endpoints`` and ``epp state``: clients of an EPP's admin gRPC API.

    epp explain --insecure -d '{"model": "m", "prompt": "hi"}'     # scores per plugin and candidate
    epp explain --plaintext --path /v1/chat/completions -d @body.json -H 'x-session-id: s1'
    epp endpoints --insecure                                        # metrics, age, role, rank
    epp state --insecure --json                                     # prefix index, sessions, queues

``explain`` runs the request through parsing, the data producers and every scheduling profile
without routing it (nothing is admitted, no pre-request hook runs, nothing is recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from epp._proto import epp_admin_v1_pb2 as pb
from epp.adminclient import tables
from epp.adminclient.channel import add_connection_flags, call, connection_hint


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected 'Name: value', got {text!r}")
    return name.strip().lower(), value.strip()


def _explain_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epp explain", description="the scores of every plugin for "
                                "every candidate, for one request, without routing it")  # fmt: skip
    add_connection_flags(p)
    p.add_argument("-d", "--data", required=True, help="request body, @FILE, or @- for stdin")
    p.add_argument("-H", "--header", type=_header, action="append", default=[],
                   metavar="'NAME: VALUE'")  # fmt: skip
    p.add_argument("--path", default="/v1/completions", help="request path (selects the parser)")
    p.add_argument("--subset", action="append", default=None, metavar="IP:PORT",
                   help="the data plane's subset hint (repeat)")  # fmt: skip
    return p


def _body(data: str) -> bytes:
    if data == "@-":
        return sys.stdin.buffer.read()
    if data.startswith("@"):
        return Path(data[1:]).read_bytes()
    return data.encode()


def explain_request(args: argparse.Namespace) -> pb.ExplainRequest:
    headers = {":path": args.path, ":method": "POST", "content-type": "application/json"}
    headers.update(dict(args.header))
    req = pb.ExplainRequest(headers=headers, body=_body(args.data))
    if args.subset is not None:
        req.has_subset_hint = True
        req.subset_hint.extend(args.subset)
    return req


def _run(args: argparse.Namespace, method: str, request: Any, render: Callable[[Any], str]) -> int:
    try:
        answer = asyncio.run(call(args, method, request))
    except ValueError as exc:
        print(f"epp: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # --insecure reads the certificate itself, before gRPC connects
        hint = connection_hint(args, str(exc))
        print(f"epp: {args.address}: {hint or exc}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as exc:
        reason = connection_hint(args, str(exc.details())) or f"{exc.code().name}: {exc.details()}"
        print(f"epp: {args.address}: {reason}", file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps(MessageToDict(answer, always_print_fields_with_no_presence=True), indent=2)
        )
    else:
        print(render(answer), end="")
    return 0


def explain_main(argv: Sequence[str]) -> int:
    args = _explain_parser().parse_args(list(argv))
    try:
        request = explain_request(args)
    except OSError as exc:
        print(f"epp explain: {exc}", file=sys.stderr)
        return 2
    return _run(args, "Explain", request, tables.explain)


def endpoints_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="epp endpoints", description="the EPP's endpoints")
    add_connection_flags(p)
    args = p.parse_args(list(argv))
    return _run(args, "ListEndpoints", pb.ListEndpointsRequest(), tables.endpoints)


def state_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="epp state", description="the EPP's routing state")
    add_connection_flags(p)
    args = p.parse_args(list(argv))
    return _run(args, "DumpState", pb.DumpStateRequest(), tables.state)
