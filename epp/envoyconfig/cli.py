"""``epp envoy-config``: the Envoy config that puts this EPP in front of a model-server pool.

    epp envoy-config --epp-address epp.ns.svc:9002 > envoy.yaml      # a complete bootstrap
    epp envoy-config --epp-address 10.0.0.5:9002 --part filter        # the listener HTTP filters
    epp envoy-config --epp-address 10.0.0.5:9002 --part clusters      # EPP + model-server clusters
    epp envoy-config --epp-address epp.ns.svc:9002 --istio -n ns      # an Istio EnvoyFilter

The output is built from typed Envoy API messages (``envoy-data-plane``) and is what
``envoy --mode validate`` accepts (the test suite checks every variant with the real binary).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from epp.envoyconfig.bootstrap import bootstrap
from epp.envoyconfig.clusters import clusters
from epp.envoyconfig.filters import http_filters
from epp.envoyconfig.istio import Context, IstioOptions, envoy_filter
from epp.envoyconfig.options import AppProtocol, BodyMode, EnvoyOptions, TlsMode, parse_hostport
from epp.envoyconfig.render import Format, as_dict, dump, dump_all


def _hostport(text: str) -> tuple[str, int]:
    try:
        return parse_hostport(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epp envoy-config", description=__doc__.split("\n\n")[0])
    _epp_flags(p)
    _proxy_flags(p)
    _connection_flags(p)
    _pool_flags(p)
    _output_flags(p)
    return p


def _epp_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--epp-address",
        type=_hostport,
        action="append",
        required=True,
        metavar="HOST:PORT",
        help="the EPP's ext_proc address; repeat for active-active replicas (health-checked)",
    )
    p.add_argument(
        "--part",
        choices=["bootstrap", "filter", "clusters"],
        default="bootstrap",
        help="a whole bootstrap (default), only the listener's HTTP filters, or only the clusters",
    )
    p.add_argument(
        "--tls",
        choices=["plaintext", "tls", "mtls"],
        default="tls",
        help="how Envoy reaches the EPP (default tls, as the EPP's --secure-serving default)",
    )
    p.add_argument("--ca-file", default="", help="CA bundle verifying the EPP's certificate")
    p.add_argument("--cert-file", default="", help="mTLS: Envoy's client certificate chain")
    p.add_argument("--key-file", default="", help="mTLS: Envoy's client private key")
    p.add_argument("--sni", default="", help="server name sent to the EPP")


def _proxy_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--body",
        choices=["full-duplex", "buffered", "streamed"],
        default="full-duplex",
        help="full-duplex: FULL_DUPLEX_STREAMED as GIE gateways use (default); buffered: the "
        "request body BUFFERED, no response messages; streamed: the request body BUFFERED, the "
        "response body STREAMED unless the EPP switches it off (mode_override)",
    )
    p.add_argument(
        "--fail-open",
        action="store_true",
        help="buffered or streamed: without an EPP answer, route to --fallback round robin",
    )
    p.add_argument(
        "--fallback",
        type=_hostport,
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="fail-open endpoints (repeat; a hostname resolves by DNS)",
    )
    p.add_argument("--listen", type=_hostport, default=("0.0.0.0", 8081), metavar="HOST:PORT")
    p.add_argument("--admin", type=_hostport, default=("127.0.0.1", 19000), metavar="HOST:PORT")
    p.add_argument("--route-timeout", type=float, default=300.0, metavar="SECONDS")
    p.add_argument(
        "--message-timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="per EPP answer; default 1000 s full-duplex (not enforced there), else 0.5 s",
    )
    p.add_argument(
        "--health-checks",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="gRPC health checks of the EPP (default: with several --epp-address)",
    )
    p.add_argument(
        "--no-report-served",
        dest="report_served",
        action="store_false",
        help="full-duplex, streamed: no Lua filter reporting the serving endpoint to the EPP",
    )


def _pool_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pool-endpoint",
        type=_hostport,
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a model server's address (repeat; a headless Service name resolves by DNS): "
        "retries go to another pod and failing pods are ejected; default: ORIGINAL_DST",
    )
    p.add_argument(
        "--pool-health-path",
        default="",
        metavar="PATH",
        help="with --pool-endpoint: HTTP health checks of the model servers on PATH (e.g. "
        "/health), so retries skip addresses with no ready server; default: none",
    )
    p.add_argument(
        "--app-protocol",
        choices=["http", "h2c"],
        default="http",
        help="how Envoy speaks to the model servers, as the InferencePool's appProtocol: http "
        "(HTTP/1.1, default) or h2c (HTTP/2 without TLS: gRPC model servers)",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=2,
        metavar="N",
        help="retries of a request that failed before its answer started (default 2; 0: none)",
    )


def _output_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--istio", action="store_true", help="emit an Istio EnvoyFilter instead")
    p.add_argument("-n", "--namespace", default="", help="--istio: the EnvoyFilter's namespace")
    p.add_argument(
        "--istio-context",
        choices=["GATEWAY", "SIDECAR_INBOUND", "SIDECAR_OUTBOUND"],
        default="GATEWAY",
    )
    p.add_argument(
        "--selector",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="--istio: workloadSelector label (repeat)",
    )
    p.add_argument(
        "--istio-route",
        default="",
        metavar="NAME",
        help="--istio: the HTTP route to send to the model-server cluster",
    )
    p.add_argument("--format", choices=["yaml", "json"], default="yaml")
    p.add_argument("-o", "--output", default="", help="write to this file instead of stdout")


def options(args: argparse.Namespace) -> EnvoyOptions:
    return EnvoyOptions(
        epp=args.epp_address,
        tls=cast(TlsMode, args.tls),
        ca_file=args.ca_file,
        cert_file=args.cert_file,
        key_file=args.key_file,
        sni=args.sni,
        body=cast(BodyMode, args.body),
        fail_open=args.fail_open,
        fallback=args.fallback,
        listen=args.listen,
        admin=args.admin,
        route_timeout=args.route_timeout,
        message_timeout=args.message_timeout,
        health_checks=args.health_checks,
        max_streams_per_connection=args.max_streams_per_connection,
        max_concurrent_requests=args.max_concurrent_requests,
        report_served=args.report_served,
        pool=args.pool_endpoint,
        pool_health_path=args.pool_health_path,
        app_protocol=cast(AppProtocol, args.app_protocol),
        retries=args.retries,
    )


def generate(args: argparse.Namespace) -> str:
    """The requested output as text; ValueError for a combination that cannot work."""
    opts = options(args)
    fmt = cast(Format, args.format)
    if args.istio:
        istio = IstioOptions(
            namespace=args.namespace,
            context=cast(Context, args.istio_context),
            selector=dict(args.selector),
            route=args.istio_route,
        )
        return dump(envoy_filter(opts, istio), fmt)
    if args.part == "filter":
        return dump_all([[as_dict(f) for f in http_filters(opts)]], fmt)
    if args.part == "clusters":
        return dump_all([[as_dict(c) for c in clusters(opts)]], fmt)
    document: dict[str, Any] = as_dict(bootstrap(opts))
    return dump(document, fmt)


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    try:
        text = generate(args)
    except ValueError as exc:
        print(f"epp envoy-config: {exc}", file=sys.stderr)
        return 2
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _connection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=100_000,
        metavar="N",
        help="requests the gateway holds in flight: Envoy's circuit breakers on every cluster "
        "(Envoy's default, 1024, answers 503 past 1024 requests in flight, since each holds an "
        "ext_proc stream)",
    )
    p.add_argument(
        "--max-streams-per-connection",
        type=int,
        default=0,
        metavar="N",
        help="open a further connection to the EPP past N streams (epp --workers; default: the "
        "EPP's own limit, 1000)",
    )
