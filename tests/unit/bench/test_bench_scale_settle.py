"""``python -m epp_tools.bench.scale.settle``: the prefix index's tables keep growing for a while
after its entries reach their bound, then keep one size however long the churn goes on."""

from __future__ import annotations

from epp_tools.bench.scale import settle


def test_the_tables_grow_past_the_entry_bound_once_then_hold_their_size() -> None:
    opts = settle.QUICK
    samples = settle.run(opts)
    bound = opts.pods * opts.capacity
    at_bound, final = settle.settled_at(samples, bound)
    assert all(s.entries <= bound for s in samples)
    assert final.total > at_bound.total and final.turns > at_bound.turns  # a step after the bound
    assert final.turns < opts.turns / 4  # then the same size for the rest of the run
    assert samples[-1].turns == opts.turns and samples[-1].total == final.total
    text = settle.table(samples, opts)
    assert "| turns | blocks held | block map MB | run LRUs MB | index tables MB |" in text
    assert f"| {opts.turns:,} | {bound:,} |" in text
