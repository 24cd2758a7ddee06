"""Each request-path check of the contract kit rejects a deliberately broken toy plugin, with a
message naming the broken rule, and passes a built-in one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest

from epp.plugin import (
    DataKey,
    ErrorCode,
    InferenceError,
    ParseResult,
    PluginBase,
    ProfileResult,
    RequestBody,
    SchedulingResult,
    ScorerCategory,
    TokenizedPrompt,
)
from epp.plugin.prefix import TOKENIZED_PROMPT
from epp.plugin.protocols import Profile
from epp.plugin.testing import (
    check_admitter,
    check_decider,
    check_hooks,
    check_parser,
    check_producer,
    check_profile_handler,
    check_role,
    check_saturation_detector,
    check_scorer,
    check_screener,
    sample_endpoints,
    sample_request,
)

EPS = sample_endpoints(4)
BODY = b'{"model":"m","prompt":"hi"}'


def toy(cls: type[Any]) -> Any:
    return cls(name="toy", params=None, handle=None)


class HalfScorer(PluginBase):
    TYPE = "half-scorer"
    category = ScorerCategory.BALANCE

    def score(self, cycle: Any, request: Any, endpoints: Sequence[Any]) -> Mapping[str, float]:
        return {e.id: 0.5 for e in endpoints[::2]}


class EmptyScorer(HalfScorer):
    def score(self, cycle: Any, request: Any, endpoints: Sequence[Any]) -> Mapping[str, float]:
        return {}


class LoudScorer(HalfScorer):
    def score(self, cycle: Any, request: Any, endpoints: Sequence[Any]) -> Mapping[str, float]:
        return {e.id: 7.0 for e in endpoints}


def test_a_scorer_must_score_every_candidate_within_0_and_1() -> None:
    with pytest.raises(AssertionError, match="did not score endpoints"):
        check_scorer(toy(HalfScorer), EPS)
    with pytest.raises(AssertionError, match="did not score endpoints"):
        check_scorer(toy(EmptyScorer), EPS)
    with pytest.raises(AssertionError, match=r"outside \[0, 1\]"):
        check_scorer(toy(LoudScorer), EPS)


class ToyParser(PluginBase):
    TYPE = "toy-parser"
    supports_model_rewrite: ClassVar[bool] = False

    def claims(self) -> tuple[str, ...]:
        return ("v1/toy",)

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParseResult:
        if not body.startswith(b"{"):
            raise InferenceError(ErrorCode.BAD_REQUEST, "not JSON")
        return ParseResult("m", RequestBody("raw", None, body))

    def rewrite_model(self, body: RequestBody, target_model: str) -> bytes:
        return body.raw

    def new_response_state(self, headers: Mapping[str, str] | None = None) -> Any:
        from epp.plugin import ParsedResponse

        class State:
            def feed(self, chunk: bytes, end_of_stream: bool) -> ParsedResponse:
                return ParsedResponse()

        return State()

    def parse_response(self, chunk: bytes, headers: Any, **kw: Any) -> Any:
        return None


class Accepting(ToyParser):
    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParseResult:
        return ParseResult("m", RequestBody("raw", None, body))


class ServerErrorParser(ToyParser):
    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParseResult:
        if not body.startswith(b"{"):
            raise InferenceError(ErrorCode.INTERNAL, "oops")
        return super().parse_request(path, body, headers)


class LyingRewrite(ToyParser):
    supports_model_rewrite: ClassVar[bool] = True


class StringFlag(ToyParser):
    supports_model_rewrite = "yes"  # type: ignore[assignment]


def test_parser_checks() -> None:
    check_parser(toy(ToyParser), "/v1/toy", BODY, b"garbage")
    with pytest.raises(AssertionError, match="accepted a malformed body"):
        check_parser(toy(Accepting), "/v1/toy", BODY, b"garbage")
    with pytest.raises(AssertionError, match="refused with 500, not 4xx"):
        check_parser(toy(ServerErrorParser), "/v1/toy", BODY, b"garbage")
    with pytest.raises(AssertionError, match="rewritten body parses to 'm'"):
        check_parser(toy(LyingRewrite), "/v1/toy", BODY)
    with pytest.raises(AssertionError, match=r"start-up refuses it as a parser.*not a bool"):
        check_parser(toy(StringFlag), "/v1/toy", BODY)


KEY: DataKey[int] = DataKey("Toy", "toy")


class ToyProducer(PluginBase):
    TYPE = "toy-producer"

    def produces(self) -> frozenset[DataKey[Any]]:
        return frozenset({KEY})

    async def produce(self, request: Any, endpoints: Sequence[Any]) -> None:
        request.attributes[KEY] = 1


class Silent(ToyProducer):
    async def produce(self, request: Any, endpoints: Sequence[Any]) -> None:
        return None


class Undeclared(ToyProducer):
    async def produce(self, request: Any, endpoints: Sequence[Any]) -> None:
        request.attributes[DataKey("Other", "toy")] = 2


class ForeignName(ToyProducer):
    def produces(self) -> frozenset[DataKey[Any]]:
        return frozenset({DataKey("Toy", "someone-else")})


class Slow(ToyProducer):
    def produce_timeout(self) -> float:
        return 0.01

    async def produce(self, request: Any, endpoints: Sequence[Any]) -> None:
        import asyncio

        await asyncio.Event().wait()  # never set: the check's timeout must end it


async def test_producer_checks() -> None:
    await check_producer(toy(ToyProducer), sample_request(), EPS)
    with pytest.raises(AssertionError, match="did not publish declared keys"):
        await check_producer(toy(Silent), sample_request(), EPS)
    await check_producer(toy(Silent), sample_request(), EPS, must_publish=False)
    with pytest.raises(AssertionError, match="published undeclared keys"):
        await check_producer(toy(Undeclared), sample_request(), EPS)
    with pytest.raises(AssertionError, match="is not '<data type>/toy'"):
        await check_producer(toy(ForeignName), sample_request(), EPS)
    with pytest.raises(AssertionError, match=r"took longer than its 0\.01 s"):
        await check_producer(toy(Slow), sample_request(), EPS)


class WrongAdmitter(PluginBase):
    TYPE = "toy-admitter"

    def admit(self, cycle: Any, request: Any, endpoints: Sequence[Any]) -> Any:
        return "no"


class Detector(PluginBase):
    TYPE = "toy-detector"

    def saturation(self, now: float, endpoints: Sequence[Any]) -> float:
        return -1.0 if not endpoints else 0.5


def test_admitter_and_detector_checks() -> None:
    with pytest.raises(AssertionError, match="admit\\(\\) returned 'no'"):
        check_admitter(toy(WrongAdmitter), sample_request(), EPS)
    with pytest.raises(AssertionError, match=r"saturation -1.0 is not in \[0, inf\)"):
        check_saturation_detector(toy(Detector), EPS)


class KeepEven(PluginBase):
    TYPE = "toy-screener"

    def screen(self, cycle: Any, request: Any, endpoints: Sequence[Any]) -> Sequence[Any]:
        return list(endpoints[::2])


class Stranger(KeepEven):
    def screen(self, cycle: Any, request: Any, endpoints: Sequence[Any]) -> Sequence[Any]:
        return [*endpoints[:1], *sample_endpoints(9)[8:]]


class Twice(KeepEven):
    def screen(self, cycle: Any, request: Any, endpoints: Sequence[Any]) -> Sequence[Any]:
        return [*endpoints[:1], *endpoints[:1]]


class Coin(KeepEven):
    """Draws from its own random source, not ``cycle.rng``: not reproducible."""

    flips = 0

    def screen(self, cycle: Any, request: Any, endpoints: Sequence[Any]) -> Sequence[Any]:
        Coin.flips += 1
        return list(endpoints[Coin.flips % 2 :])


class Eater(KeepEven):
    def screen(self, cycle: Any, request: Any, endpoints: Sequence[Any]) -> Sequence[Any]:
        assert isinstance(endpoints, list)
        return [endpoints.pop()] if endpoints else []


class Inventor(KeepEven):
    def screen(self, cycle: Any, request: Any, endpoints: Sequence[Any]) -> Sequence[Any]:
        return list(endpoints) or sample_endpoints(1)


def test_screener_check() -> None:
    assert [e.id for e in check_screener(toy(KeepEven), sample_request(), EPS)] == [
        EPS[0].id,
        EPS[2].id,
    ]
    for cls, message in (
        (Stranger, "returned endpoints it was not given"),
        (Twice, "kept an endpoint twice"),
        (Coin, "differs for the same random seed"),
        (Eater, "mutated its input"),
        (Inventor, "of no candidates kept"),
    ):
        with pytest.raises(AssertionError, match=message):
            check_screener(toy(cls), sample_request(), list(EPS))


PROFILES = {"a": Profile("a", (), (), None), "b": Profile("b", (), (), None)}  # type: ignore[arg-type]


class Handler(PluginBase):
    TYPE = "toy-handler"
    wanted: ClassVar[str] = "a"
    primary: ClassVar[str] = "a"

    def pick_profiles(self, cycle: Any, request: Any, profiles: Any, results: Any) -> Any:
        return {} if results else {self.wanted: profiles.get(self.wanted, PROFILES["a"])}

    def process_results(self, cycle: Any, request: Any, results: Any) -> SchedulingResult:
        return SchedulingResult(dict(results), self.primary)


class Unknown(Handler):
    wanted = "missing"


class Forever(Handler):
    def pick_profiles(self, cycle: Any, request: Any, profiles: Any, results: Any) -> Any:
        return {n: p for n, p in profiles.items() if n not in results} or {"a": profiles["a"]}


class WrongPrimary(Handler):
    primary = "b"


def test_profile_handler_checks() -> None:
    check_profile_handler(toy(Handler), PROFILES, sample_request(), EPS)
    with pytest.raises(AssertionError, match="chose a profile it was not given"):
        check_profile_handler(toy(Unknown), PROFILES, sample_request(), EPS)
    with pytest.raises(AssertionError, match="chose profile 'a' twice"):
        check_profile_handler(toy(Forever), PROFILES, sample_request(), EPS)
    with pytest.raises(AssertionError, match="primary profile 'b' did not run"):
        check_profile_handler(toy(WrongPrimary), PROFILES, sample_request(), EPS)


class Decider(PluginBase):
    TYPE = "toy-decider"

    def disaggregate(self, cycle: Any, request: Any, endpoint: Any) -> Any:
        return 1


class Hook(PluginBase):
    TYPE = "toy-hook"

    def response_headers(self, request: Any, response: Any, set_headers: dict[str, Any]) -> None:
        set_headers["x-toy"] = 3


class AsyncHook(PluginBase):
    TYPE = "toy-async-hook"

    async def pre_request(self, request: Any, result: Any) -> None:
        return None


def test_decider_and_hook_checks() -> None:
    with pytest.raises(AssertionError, match="disaggregate\\(\\) returned 1"):
        check_decider(toy(Decider), sample_request(), EPS[0])
    result = SchedulingResult({"a": ProfileResult(targets=(EPS[0],))}, "a")
    with pytest.raises(AssertionError, match="response headers must be strings"):
        check_hooks(toy(Hook), sample_request(), result)
    with pytest.raises(AssertionError, match="must be synchronous"):
        check_hooks(toy(AsyncHook), sample_request(), result)


class PromptReader(PluginBase):
    """Reads the prompt at completion, which the server has released by then."""

    TYPE = "toy-prompt-reader"

    def pre_request(self, request: Any, result: Any) -> None:
        self.tokens = request.attributes[TOKENIZED_PROMPT.key("token-producer")].token_count

    def response_complete(self, request: Any, response: Any) -> None:
        request.body.payload["messages"]  # None by then: a TypeError


def test_hooks_after_routing_see_the_request_released_as_the_server_gives_it() -> None:
    body = RequestBody("chat", {"messages": []}, b'{"messages":[]}', stream=True)
    prompt = TokenizedPrompt.from_token_ids([[1, 2, 3]])
    key = TOKENIZED_PROMPT.key("token-producer")
    request = sample_request(body=body, attributes={key: prompt})
    result = SchedulingResult({"a": ProfileResult(targets=(EPS[0],))}, "a")
    plugin = toy(PromptReader)
    with pytest.raises(TypeError):  # a hook that raises fails the check with its error
        check_hooks(plugin, request, result)
    assert plugin.tokens == 3  # pre_request still saw the whole prompt
    assert request.body is body and body.payload == {"messages": []}  # the caller's is intact
    assert request.attributes[key] is prompt


def test_check_role_names_the_role() -> None:
    with pytest.raises(AssertionError, match="start-up refuses it as a parser: missing `claims`"):
        check_role(toy(Hook), "parser")
