"""OpenAI-compatible request parsing and response shapes, as vLLM produces them.

Pure functions: bodies in, token ids and JSON objects out. Differences from vLLM worth knowing:
``n`` > 1, logprobs, tools execution and sampling parameters are accepted and ignored; a
completions request with several prompts is served (one choice per prompt) but not streamed.

Output length: ``max_tokens`` (completions; default 16 like vLLM), ``max_completion_tokens`` then
``max_tokens`` (chat), ``max_output_tokens`` (responses). Without a limit, chat and responses
generate the pod's ``default_max_tokens`` and finish with ``stop`` (the simulated end of
sequence); with a limit they finish with ``length``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from epp_tools.sim.tokenizer import compact_ids, render_chat, tokenize

Kind = Literal["completion", "chat", "responses"]
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        kinds = {400: "BadRequestError", 404: "NotFoundError"}
        kind = kinds.get(self.status, "InternalServerError" if self.status >= 500 else "Error")
        error = {"message": self.message, "type": kind, "param": self.param, "code": self.status}
        return {"error": error}


@dataclass(frozen=True)
class Parsed:
    kind: Kind
    model: str
    prompts: list[Sequence[int]]
    """Token ids of each prompt; a rendered chat is kept as ``array('I')``, 4 bytes a token."""
    max_tokens: int | None
    stream: bool
    include_usage: bool = False
    continuous_usage: bool = False
    messages: list[dict[str, Any]] = field(default_factory=list)
    previous_response_id: str | None = None
    store: bool = True


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model must be a non-empty string", "model")
    return model


def _limit(body: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ApiError(400, f"{key} must be a positive integer", key)
        return value
    return None


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    stream = body.get("stream") is True
    options = body.get("stream_options")
    opts = options if isinstance(options, Mapping) else {}
    return stream, opts.get("include_usage") is True, opts.get("continuous_usage_stats") is True


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def parse_completion(body: Mapping[str, Any], bos_token_id: int | None = None) -> Parsed:
    """``bos_token_id``: prepended to each text prompt (not to token-id prompts), as a tokenizer
    that adds special tokens does (vLLM's completions default)."""
    prompt = body.get("prompt")
    prompts: list[Sequence[int]]
    bos = [] if bos_token_id is None else [bos_token_id]
    if isinstance(prompt, str):
        prompts = [bos + tokenize(prompt)]
    elif _is_token_list(prompt) and prompt:
        prompts = [list(prompt)]
    elif isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            prompts = [bos + tokenize(p) for p in prompt]
        elif all(_is_token_list(p) for p in prompt):
            prompts = [list(p) for p in prompt]
        else:
            raise ApiError(400, "prompt must be a string, a list of strings or token ids", "prompt")
    else:
        raise ApiError(400, "prompt must be a non-empty string or list", "prompt")
    if any(not p for p in prompts):
        raise ApiError(400, "prompt must not be empty", "prompt")
    stream, usage, continuous = _stream_flags(body)
    if stream and len(prompts) > 1:
        raise ApiError(400, "the simulator does not stream multi-prompt completions", "prompt")
    limit = _limit(body, "max_tokens")
    return Parsed(
        kind="completion",
        model=_model(body),
        prompts=prompts,
        max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS if limit is None else limit,
        stream=stream,
        include_usage=usage,
        continuous_usage=continuous,
    )


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    if not all(isinstance(m, Mapping) for m in messages):
        raise ApiError(400, "every message must be an object", "messages")
    return [dict(m) for m in messages]


def parse_chat(body: Mapping[str, Any]) -> Parsed:
    messages = _check_messages(body.get("messages"))
    stream, usage, continuous = _stream_flags(body)
    return Parsed(
        kind="chat",
        model=_model(body),
        prompts=[compact_ids(render_chat(messages, tools=body.get("tools")))],
        max_tokens=_limit(body, "max_completion_tokens", "max_tokens"),
        stream=stream,
        include_usage=usage,
        continuous_usage=continuous,
        messages=messages,
    )


def responses_input_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The new turn's messages of a Responses request (without any previous turn)."""
    items = body.get("input")
    if isinstance(items, str):
        if not items:
            raise ApiError(400, "input must not be empty", "input")
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ApiError(400, "input must be a non-empty string or list", "input")
    messages: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, Mapping):
            raise ApiError(400, "every input item must be an object", "input")
        if "role" in item:
            messages.append({"role": str(item["role"]), "content": item.get("content")})
        else:  # tool outputs and other typed items: the model sees them as user content
            messages.append({"role": "user", "content": [dict(item)]})
    return messages


def parse_responses(body: Mapping[str, Any], previous: list[dict[str, Any]] | None) -> Parsed:
    """``previous`` is the stored conversation of ``previous_response_id`` (None if absent)."""
    new = responses_input_messages(body)
    if previous is not None:
        messages = [*previous, *new]
    else:
        instructions = body.get("instructions")
        system = [{"role": "system", "content": instructions}] if instructions else []
        messages = [*system, *new]
    stream, _, _ = _stream_flags(body)
    prev_id = body.get("previous_response_id")
    return Parsed(
        kind="responses",
        model=_model(body),
        prompts=[compact_ids(render_chat(messages, tools=body.get("tools")))],
        max_tokens=_limit(body, "max_output_tokens"),
        stream=stream,
        messages=messages,
        previous_response_id=prev_id if isinstance(prev_id, str) else None,
        store=body.get("store") is not False,
    )


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def responses_usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + completion_tokens,
    }
