"""The oracle's achievable prefix reuse of a workload: the ceiling a router can reach.

Definition (what the report's "% of oracle" divides by):

* each request is rendered exactly as the simulator renders it (``epp_tools.sim.tokenizer``: chat
  template, 4 bytes per token) and cut into blocks of the simulator's ``block_size`` tokens;
* what an earlier request leaves behind is what an engine with unlimited KV capacity would keep:
  its prompt followed by the tokens it generated, minus the last one (whose KV is never computed),
  in whole blocks; blocks are namespaced by model, so a LoRA adapter never reuses the base
  model's blocks (the simulator hashes the adapter name into every block, as vLLM does);
* a request's reusable tokens are its longest prefix, in whole blocks, found in anything an
  earlier request (earlier in the workload's send order) left behind, with the simulator's rule
  that at least one prompt token is always computed (a prompt that is entirely cached gives back
  one block);
* achievable reuse = sum of reusable tokens / sum of prompt tokens.

Capacity, timing (a request still in flight cannot be reused yet) and placement are ignored: an
oracle that sent every request to one infinitely large pod would get exactly this ratio, which
equals what the simulator reports as ``prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from xxhash import xxh64_intdigest

from epp_tools.bench.workloads.spec import BenchRequest
from epp_tools.sim.tokenizer import output_seed, output_token, render_chat


@dataclass(frozen=True)
class Oracle:
    block_size: int
    prompt_tokens: int
    reusable_tokens: int
    per_request: tuple[tuple[int, int], ...]
    """(prompt tokens, reusable tokens) of every request, in send order."""

    @property
    def ratio(self) -> float:
        return self.reusable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_json(self) -> dict[str, float | int]:
        return {
            "block_size": self.block_size,
            "prompt_tokens": self.prompt_tokens,
            "reusable_tokens": self.reusable_tokens,
            "achievable_reuse": round(self.ratio, 6),
        }


def generated_ids(prompt_ids: Sequence[int], max_tokens: int) -> list[int]:
    """The tokens the simulator answers ``prompt_ids`` with (it is deterministic)."""
    seed = output_seed(prompt_ids)
    return [output_token(seed, i) for i in range(max_tokens)]


def _chain(data: bytes, unit: int, seed: int) -> Iterable[int]:
    view = memoryview(data)
    h = seed
    for i in range(len(data) // unit):
        h = xxh64_intdigest(view[i * unit : (i + 1) * unit], h)
        yield h


def compute_oracle(requests: Sequence[BenchRequest], block_size: int) -> Oracle:
    seen: set[int] = set()
    rows: list[tuple[int, int]] = []
    unit = block_size * 4
    for req in requests:
        ids = render_chat(req.messages)
        left_behind = ids + generated_ids(ids, req.max_tokens)[:-1]
        data = array("I", left_behind).tobytes()
        prompt_blocks = len(ids) // block_size
        hits = 0
        matching = True
        for i, h in enumerate(_chain(data, unit, xxh64_intdigest(req.model.encode()))):
            if matching and i < prompt_blocks and h in seen:
                hits += 1
            else:
                matching = False
            seen.add(h)
        if hits and hits * block_size >= len(ids):
            hits -= 1  # the engine always computes at least the last prompt token
        rows.append((len(ids), hits * block_size))
    return Oracle(
        block_size=block_size,
        prompt_tokens=sum(p for p, _ in rows),
        reusable_tokens=sum(r for _, r in rows),
        per_request=tuple(rows),
    )
