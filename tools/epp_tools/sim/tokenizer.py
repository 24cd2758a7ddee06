"""Deterministic tokenizer and chat template of the simulator.

Tokenization: the UTF-8 bytes of the text, zero-padded to a multiple of 4, read as little-endian
uint32 values; every 4 bytes are one token id. This is the same rule as the EPP's ``estimate``
token producer, so the simulator and an estimating EPP agree on token counts and block contents.

Chat template: each message renders as a header segment ``<|role|>\\n`` and a body segment
``content<|end|>\\n``; every segment is padded with spaces to a multiple of 4 bytes before
tokenizing. Because segments are 4-byte aligned, the tokens of a conversation are the
concatenation of the tokens of its messages, so a follow-up turn shares the earlier turn's whole
token prefix (prompt *and* generated answer), as with a real chat template. The generation prompt
is the header segment ``<|assistant|>\\n``.

Generated text is made of 4-byte ASCII words, one token each, chosen deterministically from the
prompt, so a reply re-tokenizes to exactly the ids that were generated.
"""

from __future__ import annotations

import json
import struct
import zlib
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_WORDS: tuple[str, ...] = (
    "the ", "sim ", "and ", "one ", "two ", "red ", "sun ", "map ",
    "key ", "log ", "box ", "net ", "row ", "cat ", "dog ", "sky ",
)  # fmt: skip
_WORD_IDS: tuple[int, ...] = tuple(int.from_bytes(w.encode(), "little") for w in _WORDS)
_WORD_STRIDE = 7  # coprime with len(_WORDS): every word appears before any repeats


def tokenize(text: str) -> list[int]:
    data = text.encode()
    if not data:
        return []
    pad = -len(data) % 4
    if pad:
        data += b"\0" * pad
    return list(struct.unpack(f"<{len(data) // 4}I", data))


def compact_ids(ids: Sequence[int]) -> array[int] | list[int]:
    """``ids`` as an unsigned 32-bit array (a copy: 4 bytes a token, against about 36 in a list of
    ints), or as a list when an id does not fit (a token-id prompt sent as such)."""
    try:
        return array("I", ids)
    except (OverflowError, TypeError):
        return list(ids)


def detokenize(token_ids: Sequence[int]) -> str:
    data = struct.pack(f"<{len(token_ids)}I", *(t & 0xFFFFFFFF for t in token_ids))
    return data.replace(b"\0", b"").decode(errors="replace")


def _aligned(segment: str) -> str:
    pad = -len(segment.encode()) % 4
    return segment + " " * pad


def content_text(content: Any) -> str:
    """Text of an OpenAI message ``content``: a string or a list of typed parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces: list[str] = []
        for part in content:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, Mapping):
                kind = part.get("type", "text")
                text = part.get("text")
                if isinstance(text, str):
                    pieces.append(text)
                else:
                    pieces.append(f"<|{kind}|>")
        return "".join(pieces)
    return json.dumps(content, sort_keys=True)


def render_chat(
    messages: Iterable[Mapping[str, Any]],
    *,
    tools: Any = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    tokens: list[int] = []
    if tools:
        tokens += tokenize(_aligned(f"<|tools|>\n{json.dumps(tools, sort_keys=True)}<|end|>\n"))
    for message in messages:
        role = str(message.get("role", "user"))
        tokens += tokenize(_aligned(f"<|{role}|>\n"))
        tokens += tokenize(_aligned(f"{content_text(message.get('content'))}<|end|>\n"))
    if add_generation_prompt:
        tokens += tokenize(_aligned("<|assistant|>\n"))
    return tokens


def output_seed(prompt_ids: Sequence[int]) -> int:
    """A seed that depends on the whole prompt, so equal prompts get equal answers."""
    tail = prompt_ids[-256:]
    return zlib.crc32(struct.pack(f"<{len(tail)}I", *(t & 0xFFFFFFFF for t in tail))) + len(
        prompt_ids
    )


def output_token(seed: int, index: int) -> int:
    return _WORD_IDS[(seed + index * _WORD_STRIDE) % len(_WORD_IDS)]
