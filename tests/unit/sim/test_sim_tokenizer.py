from __future__ import annotations

import pytest

from epp_tools.sim.tokenizer import detokenize, output_seed, output_token, render_chat, tokenize


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", [], id="empty"),
        pytest.param("abcd", [int.from_bytes(b"abcd", "little")], id="one-token"),
        pytest.param("abcde", [int.from_bytes(b"abcd", "little"), ord("e")], id="zero-padded"),
        pytest.param("é", [int.from_bytes("é".encode(), "little")], id="utf8-bytes"),
    ],
)
def test_tokenize_reads_four_bytes_per_token_when_given_text(
    text: str, expected: list[int]
) -> None:
    assert tokenize(text) == expected


def test_tokenize_is_deterministic_when_called_twice() -> None:
    text = "The quick brown fox jumps over the lazy dog" * 10
    assert tokenize(text) == tokenize(text)
    assert len(tokenize(text)) == -(-len(text.encode()) // 4)


@pytest.mark.parametrize(
    "text", [pytest.param("hello world!", id="aligned"), pytest.param("odd", id="padded")]
)
def test_detokenize_inverts_tokenize_when_text_has_no_nul(text: str) -> None:
    assert detokenize(tokenize(text)) == text


def test_render_chat_extends_previous_turn_when_answer_is_appended() -> None:
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    seed = output_seed(render_chat(first))
    answer_ids = [output_token(seed, i) for i in range(5)]
    answer = detokenize(answer_ids)
    turn1 = render_chat(first) + answer_ids
    second = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "more"}]
    turn2 = render_chat(second)
    assert turn2[: len(turn1)] == turn1
    assert len(turn2) > len(turn1)


def test_render_chat_accepts_typed_parts_when_content_is_a_list() -> None:
    typed = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    plain = [{"role": "user", "content": "hello"}]
    assert render_chat(typed) == render_chat(plain)


def test_output_token_is_a_four_byte_word_when_detokenized() -> None:
    seed = output_seed(tokenize("prompt"))
    words = [detokenize([output_token(seed, i)]) for i in range(16)]
    assert all(len(w.encode()) == 4 for w in words)
    assert len(set(words)) == 16  # the stride visits every word once
    assert output_seed(tokenize("prompt")) == seed


def test_bos_token_is_prepended_to_text_prompts_only_when_configured() -> None:
    from epp_tools.sim.openai import parse_completion

    text = {"model": "m", "prompt": ["ab", "cdef"]}
    assert parse_completion(text).prompts == [tokenize("ab"), tokenize("cdef")]
    assert parse_completion(text, 9).prompts == [[9, *tokenize("ab")], [9, *tokenize("cdef")]]
    ids = {"model": "m", "prompt": [5, 6]}
    assert parse_completion(ids, 9).prompts == [[5, 6]]
