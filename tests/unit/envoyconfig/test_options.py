"""``epp envoy-config`` refuses combinations that cannot work, with the reason, and builds the
ext_proc filter and clusters the options ask for."""

from __future__ import annotations

import pytest
import yaml

from epp.envoyconfig.cli import main
from epp.envoyconfig.options import EnvoyOptions, parse_hostport

EPP = ["--epp-address", "127.0.0.1:9002"]


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--fail-open", "--fallback", "10.0.0.1:8000"], "does not fail open in FULL_DUPLEX"),
        (["--body", "buffered", "--fail-open"], "--fail-open needs --fallback"),
        (["--fallback", "10.0.0.1:8000"], "only used with --fail-open"),
        (["--tls", "mtls"], "mTLS needs a client certificate"),
        (["--tls", "plaintext", "--ca-file", "/ca.pem"], "need --tls tls or mtls"),
        (["--cert-file", "/c", "--key-file", "/k"], "needs --tls mtls"),
        (
            [
                "--body",
                "buffered",
                "--fail-open",
                "--fallback",
                "m:80",
                "--istio",
                "--istio-route",
                "r",
            ],
            "cannot fail open",
        ),
    ],
)
def test_impossible_combinations_exit_2_with_the_reason(
    args: list[str], reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*EPP, *args]) == 2
    captured = capsys.readouterr()
    assert reason in captured.err
    assert captured.out == ""


@pytest.mark.parametrize("text", ["epp", "epp:0", "epp:x", ":9002", "epp:70000"])
def test_bad_addresses_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_hostport(text)


def test_ipv6_addresses_parse() -> None:
    assert parse_hostport("[::1]:9002") == ("::1", 9002)


def _ext_proc(text: str) -> dict:  # type: ignore[type-arg]
    hcm = yaml.safe_load(text)["static_resources"]["listeners"][0]["filter_chains"][0]
    filters = hcm["filters"][0]["typed_config"]["http_filters"]
    return next(f for f in filters if f["name"] == "envoy.filters.http.ext_proc")["typed_config"]


def test_full_duplex_streams_both_bodies_and_trailers_and_does_not_fail_open(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(EPP) == 0
    ext = _ext_proc(capsys.readouterr().out)
    mode = ext["processing_mode"]
    assert mode["request_body_mode"] == mode["response_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert mode["request_trailer_mode"] == mode["response_trailer_mode"] == "SEND"
    assert "failure_mode_allow" not in ext
    assert ext["metadata_options"]["receiving_namespaces"]["untyped"] == ["envoy.lb"]


def test_buffered_fail_open_routes_undecided_requests_to_the_fallback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*EPP, "--body", "buffered", "--fail-open", "--fallback", "models:8000"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    listener = doc["static_resources"]["listeners"][0]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert [r["route"]["cluster"] for r in routes] == ["pool", "fallback"]
    assert routes[0]["match"]["headers"][0]["name"] == "x-gateway-destination-endpoint"
    ext = _ext_proc(yaml.safe_dump(doc))
    assert ext["failure_mode_allow"] is True
    assert ext["processing_mode"]["request_body_mode"] == "BUFFERED"
    fallback = doc["static_resources"]["clusters"][0]
    assert (fallback["name"], fallback["type"]) == ("fallback", "STRICT_DNS")


def test_streamed_allows_only_the_override_that_switches_the_response_body_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*EPP, "--body", "streamed"]) == 0
    ext = _ext_proc(capsys.readouterr().out)
    mode = ext["processing_mode"]
    assert (mode["request_body_mode"], mode["response_body_mode"]) == ("BUFFERED", "STREAMED")
    assert mode["response_header_mode"] == "SEND"
    assert ext["allow_mode_override"] is True
    (allowed,) = ext["allowed_override_modes"]
    # Envoy compares the resolved override with each entry field by field: every field of the
    # configured mode is spelled out, and only the response body differs (NONE, left out)
    assert allowed == {k: v for k, v in mode.items() if k != "response_body_mode"}
    assert ext["route_cache_action"] == "CLEAR"  # the decision comes with the body reply


@pytest.mark.parametrize("body", ["full-duplex", "buffered"])
def test_no_mode_override_where_the_epp_never_asks_for_one(
    body: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # full-duplex: Envoy ignores mode_override; buffered: the EPP sees no response headers
    assert main([*EPP, "--body", body]) == 0
    ext = _ext_proc(capsys.readouterr().out)
    assert "allow_mode_override" not in ext and "allowed_override_modes" not in ext


def test_replicas_are_health_checked_without_panic_routing() -> None:
    from epp.envoyconfig.clusters import epp_cluster
    from epp.envoyconfig.render import as_dict

    one = as_dict(epp_cluster(EnvoyOptions(epp=[("10.0.0.1", 9002)])))
    two = as_dict(epp_cluster(EnvoyOptions(epp=[("10.0.0.1", 9002), ("10.0.0.2", 9002)])))
    assert "health_checks" not in one
    check = two["health_checks"][0]
    assert check["grpc_health_check"] == {}
    # a slow answer (a busy replica) takes it out only after three timeouts in a row, as
    # upstream's configs; NOT_SERVING still does at once (test_envoy_replica_health.py)
    assert (check["timeout"], check["unhealthy_threshold"]) == ("2s", 3)
    assert two["common_lb_config"]["healthy_panic_threshold"] in ({}, {"value": 0.0})


def test_output_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "envoy.yaml"
    assert main([*EPP, "-o", str(out)]) == 0
    assert capsys.readouterr().out == ""
    assert (
        yaml.safe_load(out.read_text())["admin"]["address"]["socket_address"]["port_value"] == 19000
    )


_H2 = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


@pytest.mark.parametrize(
    "pool",
    [
        pytest.param([], id="original-dst"),
        pytest.param(["--pool-endpoint", "10.0.0.7:8000"], id="pool"),
    ],
)
def test_h2c_app_protocol_speaks_http2_to_the_model_servers(
    pool: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    fail_open = ["--body", "buffered", "--fail-open", "--fallback", "10.0.0.9:8000"]
    assert main([*EPP, *pool, *fail_open, "--app-protocol", "h2c", "--part", "clusters"]) == 0
    (clusters,) = yaml.safe_load_all(capsys.readouterr().out)
    by_name = {c["name"]: c for c in clusters}
    for name in ("pool", "fallback"):
        options = by_name[name]["typed_extension_protocol_options"][_H2]
        assert "http2_protocol_options" in options["explicit_http_config"], name
    assert main([*EPP, *pool, "--part", "clusters"]) == 0  # http (the default): HTTP/1.1
    (clusters,) = yaml.safe_load_all(capsys.readouterr().out)
    pool_cluster = next(c for c in clusters if c["name"] == "pool")
    assert "typed_extension_protocol_options" not in pool_cluster


def test_unknown_app_protocol_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*EPP, "--app-protocol", "h3"])
    assert info.value.code == 2
    assert "invalid choice: 'h3'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "limit"),
    [pytest.param([], 100_000, id="default"), (["--max-concurrent-requests", "5000"], 5000)],
)
def test_every_cluster_holds_more_than_envoys_1024_requests_in_flight(
    extra: list[str], limit: int, capsys: pytest.CaptureFixture[str]
) -> None:
    fail_open = ["--body", "buffered", "--fail-open", "--fallback", "10.0.0.9:8000"]
    for pool in ([], ["--pool-endpoint", "10.0.0.7:8000"]):
        assert main([*EPP, *pool, *fail_open, *extra, "--part", "clusters"]) == 0
        (clusters,) = yaml.safe_load_all(capsys.readouterr().out)
        assert {c["name"] for c in clusters} == {"epp", "pool", "fallback"}
        for cluster in clusters:
            (threshold,) = cluster["circuit_breakers"]["thresholds"]
            for key in ("max_connections", "max_pending_requests", "max_requests"):
                assert threshold[key] == limit, (cluster["name"], key)


def test_max_concurrent_requests_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*EPP, "--max-concurrent-requests", "0"]) == 2
    assert "max concurrent requests must be >= 1" in capsys.readouterr().err


def test_envoy_opens_a_further_connection_at_the_epps_stream_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from epp.envoyconfig.clusters import EPP_MAX_CONCURRENT_STREAMS
    from epp.server.h2limits import MAX_CONCURRENT_STREAMS

    assert EPP_MAX_CONCURRENT_STREAMS == MAX_CONCURRENT_STREAMS
    for extra, limit in (([], MAX_CONCURRENT_STREAMS), (["--max-streams-per-connection", "4"], 4)):
        assert main([*EPP, *extra, "--part", "clusters"]) == 0
        (clusters,) = yaml.safe_load_all(capsys.readouterr().out)
        epp = next(c for c in clusters if c["name"] == "epp")
        options = epp["typed_extension_protocol_options"][_H2]["explicit_http_config"]
        assert options["http2_protocol_options"]["max_concurrent_streams"] == limit
