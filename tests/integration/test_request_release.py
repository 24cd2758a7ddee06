"""A routed request lets its content go once the body is sent on (``Director.sent``): in a
running EPP with its default prefix and KV plugins, what a request holds while its answer
streams is a few kilobytes, not its prompt (``epp_tools.bench.scale.retain``), and the response
side still reads what it needs and completes it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from epp.plugin import TOKENIZED_PROMPT, TerminationCause, TokenizedPrompt
from epp_tools.bench.scale import retain


async def test_a_sent_request_holds_kilobytes_and_one_kept_holds_its_prompt() -> None:
    result = await retain.run(retain.QUICK)
    assert result.kept_bytes > result.body_bytes  # the decoded JSON and the token ids, at least
    assert result.sent_bytes < result.body_bytes / 10
    table = retain.table(result, retain.QUICK)
    assert "| let go once sent on (`Director.sent`) |" in table


async def test_the_response_side_reads_what_stays_and_completes(
    start_app: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = await start_app([1, 2, 3])  # nothing listens: scheduling needs no answer
    director = app.context.director
    kept = await retain.held(director, retain.turns(5, 2_000, seed=1), send=True)
    key = TOKENIZED_PROMPT.key("token-producer")
    caplog.set_level(logging.ERROR)
    for ex in kept:
        request = ex.request
        assert request.body is not None and request.body.released
        assert request.body.raw == b"" and request.body.payload is None
        assert (request.body.kind, request.body.stream) == ("chat", True)  # read by responses
        prompt = key.get(request)
        assert isinstance(prompt, TokenizedPrompt) and prompt.prompts == ()
        assert prompt.token_count > 2_000  # the count stays for the completion hooks
        assert ex.decision is not None and ex.decision.body == b""
        sse = {":status": "200", "content-type": "text/event-stream"}
        director.on_response_headers(ex, sse, "")
        director.on_response_chunk(ex, b"data: [DONE]\n\n", True, hold_limit=None, copy_held=False)
        assert ex.completed
    director.complete(kept[0], TerminationCause.NATURAL)  # once only
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
