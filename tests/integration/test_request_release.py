"""A routed request lets its content go once the body is sent on (``Director.sent``): a running
EPP with its default prefix and KV plugins routes long prompts, and what stays per request while
the answers stream is a few kilobytes, not the prompt; the response side still completes them."""

from __future__ import annotations

import gc
import json
import logging
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from epp.plugin import TOKENIZED_PROMPT, TerminationCause, TokenizedPrompt
from epp.requestcontrol.director import Director
from epp.requestcontrol.exchange import Exchange

HEADERS = {":path": "/v1/chat/completions", "content-type": "application/json"}
SHARED = " ".join(f"w{j}" for j in range(20_000))  # ~130 KB, one prefix for all (the index is
# shared state, bounded on its own; what is measured here is what each request holds)


def body(i: int) -> bytes:
    text = SHARED + " " + " ".join(f"u{i}x{j}" for j in range(50))
    return json.dumps(
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": text}]}
    ).encode()


async def route_all(
    director: Director, bodies: list[bytes], *, send: bool
) -> tuple[list[Exchange], int]:
    """Route every body (and, with ``send``, let each go as the server does once it answered):
    the exchanges, kept as the server keeps them while answers stream, and the bytes they hold."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        kept = []
        for b in bodies:
            ex = director.begin(HEADERS)
            await director.route(ex, b, {})
            if send:
                director.sent(ex)
            kept.append(ex)
        gc.collect()
        return kept, tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


async def test_a_sent_request_holds_kilobytes_not_its_prompt(
    start_app: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = await start_app([1, 2, 3])  # nothing listens: scheduling needs no answer
    director = app.context.director
    await route_all(director, [body(-1)], send=True)  # the prefix is indexed once, up front
    bodies = [body(i) for i in range(40)]
    size = sum(map(len, bodies)) // len(bodies)

    kept, held = await route_all(director, bodies, send=False)
    assert held / len(bodies) > size  # the decoded JSON and the token ids, at least
    del kept
    kept, held = await route_all(director, bodies, send=True)
    assert held / len(bodies) < size / 10

    key = TOKENIZED_PROMPT.key("token-producer")
    caplog.set_level(logging.ERROR)
    for ex in kept:
        request = ex.request
        assert request.body is not None and request.body.released
        assert request.body.raw == b"" and request.body.payload is None
        assert request.body.kind == "chat"
        assert request.body.stream  # the response side still reads it
        prompt = key.get(request)
        assert isinstance(prompt, TokenizedPrompt) and prompt.prompts == ()
        assert prompt.token_count > 20_000 // 4  # the count stays for the completion hooks
        assert ex.decision is not None and ex.decision.body == b""
        director.on_response_headers(
            ex, {":status": "200", "content-type": "text/event-stream"}, ""
        )
        director.on_response_chunk(ex, b"data: [DONE]\n\n", True, hold_limit=None, copy_held=False)
        assert ex.completed
    director.complete(kept[0], TerminationCause.NATURAL)  # once only
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
