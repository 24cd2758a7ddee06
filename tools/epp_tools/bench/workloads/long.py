"""Long chat prompts for the cost benchmarks: distinct ones (each a fresh 195,000-token prompt,
the worst case for the prefix index and its sharing) and one agent's turns (a shared context and
a distinct tail, as the study's main-agent turns reuse at least 90% of their input).

Used by ``epp bench scale cores``, ``epp bench micro``'s in-process long-request row and the heap
tools; lengths are in 4-byte words of ``epp_tools.bench.workloads.text``, about one token each.
"""

from __future__ import annotations

import random

import orjson

from epp_tools.bench.workloads.spec import MODEL
from epp_tools.bench.workloads.text import words

TURN_TAIL_TOKENS = 1_300
"""The new part of an agent's turn: a tool result and the last answer (the study's medians,
about 1,000 and 317 tokens); the rest of the prompt is the context the turns share."""


def big_bodies(n: int, tokens: int, seed: int) -> list[bytes]:
    """``n`` chat requests of about ``tokens`` prompt tokens (1 output token), distinct."""
    rng = random.Random(seed)
    context = words(rng, tokens)
    out = []
    for i in range(n):
        messages = [{"role": "user", "content": f"q{i:04d} " + context[5:]}]
        body = {"model": MODEL, "messages": messages, "max_tokens": 1, "stream": True}
        out.append(orjson.dumps(body))
    return out


def turn_bodies(n: int, tokens: int, seed: int, run: int) -> list[bytes]:
    """``n`` turns of one agent (1 output token): about ``tokens`` prompt tokens each, one shared
    context (the same for every ``run`` of a ``seed``) and a distinct ``TURN_TAIL_TOKENS`` tail."""
    context = words(random.Random(seed), max(tokens - TURN_TAIL_TOKENS, 1))
    rng = random.Random(f"{seed}-{run}")
    out = []
    for i in range(n):
        tail = f"r{run}-t{i:04d} " + words(rng, TURN_TAIL_TOKENS)
        messages = [{"role": "user", "content": context},
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": tail}]  # fmt: skip
        body = {"model": MODEL, "messages": messages, "max_tokens": 1, "stream": True}
        out.append(orjson.dumps(body))
    return out
