"""How the approximate prefix index's memory settles once it is at its bound: the size of its
hash tables (``sys.getsizeof`` of its block map and of every endpoint's run LRU) while agents'
turns churn it, long after the blocks it holds stopped growing. The blocks held are what the
pods' KV bounds; past a prompt's first 16 blocks one entry stands for 8 (``indexStride``), so the
tables hold fewer entries than blocks.

CPython grows a dict's table when its free slots run out, and a deletion does not free a slot: at
its bound every new block deletes an evicted one and takes a slot, so each table grows once more,
to the size its churn keeps (about three times its entries, rounded up to a power of two), some
time after the entries reached their bound, and then stays. A hold that starts before every table
has made that step sees the RSS rise by it (``epp bench scale --hold-minutes``).

The index is the one ``epp bench scale`` fills at 3,000 agents (16 pods of 23,664 blocks, the
pods' KV in 64-token blocks); the turns are agents' (a known context plus ``new_blocks`` new
blocks; a context past ``max_blocks`` starts afresh, as a compaction does)::

    python -m epp_tools.bench.scale.settle           # 60,000 turns of 3,000 agents
    python -m epp_tools.bench.scale.settle --quick   # a small index (tests)
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from epp.plugins.producers.prefix_index import PrefixIndex


@dataclass(frozen=True)
class Options:
    pods: int = 16
    capacity: int = 23_664
    agents: int = 3_000
    start_blocks: int = 150
    new_blocks: int = 20
    max_blocks: int = 400
    turns: int = 60_000
    every: int = 500
    seed: int = 1


QUICK = Options(pods=4, capacity=2_000, agents=100, turns=3_000, every=10)


@dataclass(frozen=True)
class Sample:
    turns: int
    entries: int
    map_bytes: int
    lru_bytes: int

    @property
    def total(self) -> int:
        return self.map_bytes + self.lru_bytes


def run(opts: Options) -> list[Sample]:
    rng = random.Random(opts.seed)
    index = PrefixIndex(opts.capacity)

    def fresh(n: int) -> list[int]:
        return [rng.getrandbits(63) for _ in range(n)]

    agents = [(f"pod-{i % opts.pods}", fresh(opts.start_blocks)) for i in range(opts.agents)]
    out: list[Sample] = []
    for turn in range(1, opts.turns + 1):
        i = rng.randrange(len(agents))
        pod, chain = agents[i]
        chain = chain + fresh(opts.new_blocks)
        if len(chain) > opts.max_blocks:
            chain = fresh(opts.start_blocks)
        agents[i] = (pod, chain)
        index.add(pod, chain)
        if turn % opts.every == 0:
            sample = Sample(turn, index.size, *index.table_bytes())
            if not out or sample.total != out[-1].total or turn == opts.turns:
                out.append(sample)  # each change, and the last
    return out


def settled_at(samples: list[Sample], bound: int) -> tuple[Sample, Sample]:
    """The first sample at the entry bound and the first whose tables are at their last size."""
    at_bound = next(s for s in samples if s.entries >= bound)
    final = next(s for s in samples if s.total == samples[-1].total)
    return at_bound, final


def table(samples: list[Sample], opts: Options) -> str:
    bound = opts.pods * opts.capacity
    rows = [
        f"{opts.pods} pods x {opts.capacity:,} blocks ({bound:,} blocks held at the bound), "
        f"{opts.agents:,} agents, {opts.new_blocks} new blocks a turn:",
        "",
        f"Sampled every {opts.every:,} turns; a row for each change of the tables, and the last:",
        "",
        "| turns | blocks held | block map MB | run LRUs MB | index tables MB | bytes per block |",
        "|---|---|---|---|---|---|",
    ]
    for s in samples:
        rows.append(
            f"| {s.turns:,} | {s.entries:,} | {s.map_bytes / 2**20:.1f} | "
            f"{s.lru_bytes / 2**20:.1f} | {s.total / 2**20:.1f} | "
            f"{s.total / max(s.entries, 1):.0f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m epp_tools.bench.scale.settle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="a small index (tests)")
    opts = QUICK if p.parse_args(argv).quick else Options()
    print(table(run(opts), opts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
