"""Synthetic text whose token count is known without tokenizing it.

Every word is three lowercase letters and a space: 4 bytes, so exactly one token for the
simulator's tokenizer (and the EPP's ``estimate`` token producer), whatever the word. A message
of ``n`` words therefore costs a known number of tokens in the simulator's chat template (see
``epp_tools.sim.tokenizer``): a header segment ``<|role|>\\n`` and a body segment
``content<|end|>\\n``, each padded to a multiple of 4 bytes::

    message_tokens(role, n) = ceil(len("<|role|>\\n") / 4) + n + 2
    prompt_tokens(messages) = sum(message_tokens) + 4      # the generation prompt <|assistant|>\\n

so generators can plan 195K-token conversations by counting, and only build the strings when a
request is sent.
"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Iterable, Sequence
from typing import Final

WORDS: Final[tuple[str, ...]] = tuple(
    a + b + c + " "
    for a in string.ascii_lowercase
    for b in string.ascii_lowercase
    for c in string.ascii_lowercase
)
GENERATION_PROMPT_TOKENS: Final = 4  # "<|assistant|>\n" is 14 bytes, padded to 16
BODY_OVERHEAD_TOKENS: Final = 2  # "<|end|>\n" after word-aligned content


def words(rng: random.Random, n: int) -> str:
    """``n`` random words: ``n`` tokens, ``4 n`` bytes."""
    return "".join(rng.choices(WORDS, k=n)) if n > 0 else ""


def header_tokens(role: str) -> int:
    return -(-len(f"<|{role}|>\n".encode()) // 4)


def message_tokens(role: str, n_words: int) -> int:
    return header_tokens(role) + n_words + BODY_OVERHEAD_TOKENS


def prompt_tokens(messages: Iterable[tuple[str, int]]) -> int:
    """Prompt length of ``(role, word count)`` messages in the simulator's chat template."""
    return sum(message_tokens(role, n) for role, n in messages) + GENERATION_PROMPT_TOKENS


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1]); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered), max(1, math.ceil(q * len(ordered) - 1e-9)))
    return float(ordered[rank - 1])
