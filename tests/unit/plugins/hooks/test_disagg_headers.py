from __future__ import annotations

import logging
from typing import Any

import pytest

from epp.plugin import PreRequest, ProfileResult, SchedulingResult
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_plugin_class
from epp.plugins.hooks.disagg_headers import DisaggHeadersHandler, PrefillHeaderHandler
from tests.builders import handle, make_endpoint, make_request

D, P, E1, E2 = (make_endpoint(i) for i in range(4))


def _result(**profiles: tuple[Any, ...]) -> SchedulingResult:
    return SchedulingResult({k: ProfileResult(v) for k, v in profiles.items()}, "decode")


@pytest.mark.parametrize(
    ("cls", "type_name"),
    [
        (DisaggHeadersHandler, "disagg-headers-handler"),
        (PrefillHeaderHandler, "prefill-header-handler"),
    ],
)
def test_sets_prefill_and_encode_headers(
    cls: type[DisaggHeadersHandler], type_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    check_plugin_class(cls, type_name)
    with caplog.at_level(logging.INFO):
        hook = cls(name=type_name, params=decode(cls.Params, None), handle=handle())
    assert f"plugin type '{type_name}' is deprecated" in caplog.text
    assert isinstance(hook, PreRequest)
    request = make_request(upstream_headers={"x-encoder-hosts-ports": "stale"})
    hook.pre_request(request, _result(decode=(D,), prefill=(P,), encode=(E1, E2)))
    assert request.upstream_headers == {
        "x-prefiller-host-port": P.hostport,
        "x-encoder-hosts-ports": f"{E1.hostport},{E2.hostport}",
    }
    hook.pre_request(request, _result(decode=(D,)))
    assert request.upstream_headers == {}


def test_custom_profile_names() -> None:
    params = decode(PrefillHeaderHandler.Params, {"prefillProfile": "p", "encodeProfile": "e"})
    hook = PrefillHeaderHandler(name="h", params=params, handle=handle())
    request = make_request()
    hook.pre_request(request, _result(decode=(D,), prefill=(E1,), p=(P,), e=(E2,)))
    assert request.upstream_headers == {
        "x-prefiller-host-port": P.hostport,
        "x-encoder-hosts-ports": E2.hostport,
    }


def test_unknown_parameter_is_rejected() -> None:
    with pytest.raises(ParamError, match="decodeProfile: unknown field"):
        decode(DisaggHeadersHandler.Params, {"decodeProfile": "d"})
