"""The HTTP filters of the listener: the ext_proc filter that asks the EPP, the optional Lua
hooks around it, and the router. Typed ``envoy-data-plane`` messages, packed into ``Any``.

Processing-mode override: Envoy (1.40) honours a ``mode_override`` in the EPP's reply to request
or response headers only when no body mode of the filter is FULL_DUPLEX_STREAMED, and, when the
filter lists ``allowed_override_modes``, only if the mode the override results in (its DEFAULT
header and trailer modes resolved to the configured ones) equals an entry field by field
(``request_header_mode`` aside). So ``allow_mode_override`` is set only in streamed mode, with the
one mode the EPP asks for: the configured one with the response body NONE
(``epp.server.stream``)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from envoy_data_plane.envoy.config.core.v3 import DataSource, GrpcService, GrpcServiceEnvoyGrpc
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExternalProcessor,
    ExternalProcessorRouteCacheAction,
    MetadataOptions,
    MetadataOptionsMetadataNamespaces,
    ProcessingMode,
    ProcessingModeBodySendMode,
    ProcessingModeHeaderSendMode,
)
from envoy_data_plane.envoy.extensions.filters.http.lua.v3 import Lua
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)
from envoy_data_plane.google.protobuf import Any

from epp.envoyconfig.options import DESTINATION_HEADER, EnvoyOptions

EXT_PROC = "envoy.filters.http.ext_proc"
EPP_CLUSTER = "epp"
LB_NAMESPACE = "envoy.lb"
SUBSET_HINT_NAMESPACE = "envoy.lb.subset_hint"

_SUBSET_HINT_LUA = f"""\
-- Tests: a client header x-test-subset-hint: ip:port,... becomes the subset hint a data plane
-- would set ({SUBSET_HINT_NAMESPACE} metadata; an empty value is an empty list).
function envoy_on_request(h)
  local hint = h:headers():get("x-test-subset-hint")
  if hint ~= nil then
    local list = {{}}
    for item in string.gmatch(hint, "[^,]+") do table.insert(list, item) end
    h:streamInfo():dynamicMetadata():set("{SUBSET_HINT_NAMESPACE}",
      "{DESTINATION_HEADER}-subset", list)
    h:headers():remove("x-test-subset-hint")
  end
end
"""

_SERVED_LUA = f"""\
-- After ext_proc in the chain, so on the response path it runs first and the EPP sees the
-- endpoint that served the request in the response-phase {LB_NAMESPACE} metadata.
function envoy_on_request(h)
end
function envoy_on_response(h)
  local served = h:headers():get("x-envoy-upstream-host")
  local lb = h:streamInfo():dynamicMetadata():get("{LB_NAMESPACE}")
  if served == nil and lb ~= nil then
    served = lb["{DESTINATION_HEADER}"]
  end
  if served ~= nil then
    h:streamInfo():dynamicMetadata():set("{LB_NAMESPACE}", "{DESTINATION_HEADER}-served", served)
  end
end
"""


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def processing_mode(opts: EnvoyOptions) -> ProcessingMode:
    send, skip = ProcessingModeHeaderSendMode.SEND, ProcessingModeHeaderSendMode.SKIP
    if opts.body == "streamed":
        return ProcessingMode(
            request_header_mode=send,
            response_header_mode=send,
            request_body_mode=ProcessingModeBodySendMode.BUFFERED,
            response_body_mode=ProcessingModeBodySendMode.STREAMED,
            request_trailer_mode=skip,
            response_trailer_mode=skip,
        )
    if opts.body == "full-duplex":
        streamed = ProcessingModeBodySendMode.FULL_DUPLEX_STREAMED
        return ProcessingMode(
            request_header_mode=send,
            response_header_mode=send,
            request_body_mode=streamed,
            response_body_mode=streamed,
            request_trailer_mode=send,
            response_trailer_mode=send,
        )
    return ProcessingMode(
        request_header_mode=send,
        response_header_mode=skip,
        request_body_mode=ProcessingModeBodySendMode.BUFFERED,
        response_body_mode=ProcessingModeBodySendMode.NONE,
        request_trailer_mode=skip,
        response_trailer_mode=skip,
    )


def ext_proc(opts: EnvoyOptions) -> ExternalProcessor:
    """The ext_proc filter's config: the EPP cluster, processing modes, fail-open choice and the
    metadata namespaces of the Endpoint Picker Protocol."""
    forwarding = [LB_NAMESPACE, SUBSET_HINT_NAMESPACE]
    mode = processing_mode(opts)
    overridable = opts.body == "streamed"
    return ExternalProcessor(
        grpc_service=GrpcService(
            envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=EPP_CLUSTER),
            timeout=seconds(opts.grpc_timeout),
        ),
        failure_mode_allow=opts.fail_open,
        message_timeout=seconds(opts.effective_message_timeout),
        allow_mode_override=overridable,
        allowed_override_modes=[skip_response_body(mode)] if overridable else [],
        route_cache_action=(
            ExternalProcessorRouteCacheAction.CLEAR
            if opts.request_buffered
            else ExternalProcessorRouteCacheAction.DEFAULT
        ),
        processing_mode=mode,
        metadata_options=MetadataOptions(
            forwarding_namespaces=MetadataOptionsMetadataNamespaces(untyped=forwarding),
            receiving_namespaces=MetadataOptionsMetadataNamespaces(untyped=[LB_NAMESPACE]),
        ),
    )


def skip_response_body(mode: ProcessingMode) -> ProcessingMode:
    """``mode`` with the response body NONE: what the EPP's ``mode_override`` results in."""
    return dataclasses.replace(mode, response_body_mode=ProcessingModeBodySendMode.NONE)


def ext_proc_filter(opts: EnvoyOptions) -> HttpFilter:
    return HttpFilter(name=EXT_PROC, typed_config=Any.pack(ext_proc(opts)))


def _lua(source: str) -> HttpFilter:
    return HttpFilter(
        name="envoy.filters.http.lua",
        typed_config=Any.pack(Lua(default_source_code=DataSource(inline_string=source))),
    )


def router_filter() -> HttpFilter:
    return HttpFilter(name="envoy.filters.http.router", typed_config=Any.pack(Router()))


def http_filters(opts: EnvoyOptions) -> list[HttpFilter]:
    """The listener's HTTP filter chain, in order: [subset-hint hook], ext_proc, [served-endpoint
    hook], router."""
    chain: list[HttpFilter] = []
    if opts.subset_hint_header:
        chain.append(_lua(_SUBSET_HINT_LUA))
    chain.append(ext_proc_filter(opts))
    if opts.report_served and opts.sends_response:
        chain.append(_lua(_SERVED_LUA))
    chain.append(router_filter())
    return chain
