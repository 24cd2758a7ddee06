"""What a routed request keeps of its content (``RequestBody.release``,
``TokenizedPrompt.count_only``): the scalars the response side reads, none of the content."""

from __future__ import annotations

import pytest

from epp.plugin import RequestBody, TokenizedPrompt


def test_release_drops_the_content_and_keeps_the_scalars() -> None:
    body = RequestBody(
        "chat",
        {"messages": []},
        b"{...}",
        stream=True,
        max_output_tokens=9,
        cache_salt="s",
        token_ids=(1, 2),
    )
    body.release()
    assert (body.raw, body.payload, body.token_ids, body.released) == (b"", None, None, True)
    assert (body.kind, body.stream, body.max_output_tokens, body.cache_salt) == (
        "chat",
        True,
        9,
        "s",
    )


def test_count_only_keeps_the_count_and_salt_without_the_ids() -> None:
    prompt = TokenizedPrompt.from_token_ids([[1, 2, 3], [4]], "salt")
    slim = prompt.count_only()
    assert (slim.prompts, slim.token_count, slim.cache_salt) == ((), 4, "salt")
    assert prompt.token_count == 4 and len(prompt.prompts) == 2  # the original is unchanged
    with pytest.raises(IndexError):
        slim.token_ids()
