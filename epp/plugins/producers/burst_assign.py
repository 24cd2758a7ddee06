"""Joint placement of one ``burst-prefix-cache-producer`` window (pure, synchronous).

Each ``Entry`` is one request: its prompts' chained block hashes (``prefix_index.block_hashes``:
equal leading hashes mean an equal leading prompt prefix) and its candidate endpoints.
``assign`` sets ``Entry.assigned`` (an endpoint id, or ``None`` for no affinity):

1. Requests with the same full hash sequence form a group. A group of two or more is a unit; a
   lone request is a unit only when ``min_colocate_blocks > 0`` and its first
   ``min_colocate_blocks`` blocks equal those of another request of the window.
2. Groups are placed first, then lone units, each tier longest prefix first (stable).
3. A unit's first replica: with ``min_colocate_blocks > 0``, the replica already holding the
   longest run (at least ``min_colocate_blocks``) of the unit's leading blocks from units placed
   before, if it is below its fair share (``ceil(total / replicas)``) and, with
   ``max_per_replica``, below that cap for this unit; otherwise the least loaded replica. Further
   members fill that replica up to ``max_per_replica`` (-1: no cap, the whole group stays), then
   spill to the next least loaded replica with room (the least loaded of all when none has).
4. Load is counted in requests, or with ``by_tokens`` in prefix blocks: a unit charges each
   replica it lands on once, minus the leading blocks that replica already holds.

Ties go to fewer running requests (``Metrics.running_requests_size``), then the lower endpoint
id. The replicas are the first unit member's candidates, as upstream.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from epp.plugin import Endpoint

UNLIMITED = -1

Chains = tuple[list[int], ...]
"""One chain of block hashes per prompt."""


@dataclass(slots=True, eq=False)
class Entry:
    hashes: Chains
    pods: Sequence[Endpoint]
    assigned: str | None = None


def total_blocks(hashes: Chains) -> int:
    return sum(len(chain) for chain in hashes)


def prefix(hashes: Chains, n: int) -> tuple[int, ...]:
    """The first ``n`` block hashes over the prompts in order."""
    return tuple(itertools.islice(itertools.chain.from_iterable(hashes), n))


class _Holders:
    """Which replicas hold each block of the units placed so far in this window."""

    def __init__(self) -> None:
        self._holders: dict[int, set[str]] = {}

    def add(self, hashes: Chains, replica: str) -> None:
        for h in itertools.chain.from_iterable(hashes):
            self._holders.setdefault(h, set()).add(replica)

    def longest_prefix(self, hashes: Chains) -> Counter[str]:
        """Replica → leading blocks of ``hashes`` it holds (a whole prefix is added at once, so
        holding block i means holding the blocks before it)."""
        found: Counter[str] = Counter()
        for h in itertools.chain.from_iterable(hashes):
            holders = self._holders.get(h)
            if not holders:
                break
            found.update(holders)
        return found


@dataclass(slots=True)
class _Window:
    replicas: Sequence[Endpoint]
    k: int
    min_colocate: int
    by_tokens: bool
    max_share: int
    holders: _Holders
    load: Counter[str]


def assign(entries: Sequence[Entry], k: int, min_colocate: int, by_tokens: bool) -> None:
    groups: dict[tuple[int, ...], list[Entry]] = {}
    replicas: Sequence[Endpoint] = ()
    for e in entries:
        n = total_blocks(e.hashes)
        if n == 0:
            continue
        groups.setdefault(prefix(e.hashes, n), []).append(e)
        replicas = replicas or e.pods
    if not replicas:
        return
    shared = _shared(groups, min_colocate)
    group_units = [key for key, members in groups.items() if len(members) >= 2]
    single_units = [key for key, members in groups.items() if len(members) == 1 and key in shared]
    if not group_units and not single_units:
        return
    group_units.sort(key=len, reverse=True)  # the key is the hash sequence: len = blocks
    single_units.sort(key=len, reverse=True)
    units = group_units + single_units
    total = sum(len(key) if by_tokens else len(groups[key]) for key in units)
    window = _Window(
        replicas=replicas,
        k=k,
        min_colocate=min_colocate,
        by_tokens=by_tokens,
        max_share=-(-total // len(replicas)),
        holders=_Holders(),
        load=Counter(),
    )
    for key in units:
        _place(groups[key], len(key), window)


def _shared(groups: dict[tuple[int, ...], list[Entry]], min_colocate: int) -> set[tuple[int, ...]]:
    """Group keys whose first ``min_colocate`` blocks equal another request's."""
    if min_colocate <= 0:
        return set()
    count: Counter[tuple[int, ...]] = Counter()
    signature = {}
    for key, members in groups.items():
        if len(key) >= min_colocate:
            signature[key] = key[:min_colocate]
            count[key[:min_colocate]] += len(members)
    return {key for key, sig in signature.items() if count[sig] >= 2}


def _place(members: list[Entry], cost: int, w: _Window) -> None:
    hashes = members[0].hashes
    prefer = w.min_colocate > 0
    matches = w.holders.longest_prefix(hashes) if prefer or w.by_tokens else Counter()
    per_replica: Counter[str] = Counter()
    i = 0
    while i < len(members):
        target = _pick(w, per_replica, matches, prefer).id
        run = len(members) - i
        if w.k != UNLIMITED:
            run = min(run, max(1, w.k - per_replica[target]))
        for m in members[i : i + run]:
            m.assigned = target
        first = per_replica[target] == 0
        per_replica[target] += run
        if not w.by_tokens:
            w.load[target] += run
        elif first:
            w.load[target] += max(0, cost - matches[target])
        i += run
        prefer = False  # only the first replica gets the prefix preference
    for m in members:
        if m.assigned is not None:
            w.holders.add(hashes, m.assigned)


def _pick(w: _Window, per_replica: Counter[str], matches: Counter[str], prefer: bool) -> Endpoint:
    def order(ep: Endpoint) -> tuple[int, int, str]:
        running = ep.metrics.running_requests_size if ep.metrics is not None else 0
        return (w.load[ep.id], running, ep.id)

    room = [ep for ep in w.replicas if w.k == UNLIMITED or per_replica[ep.id] < w.k]
    if prefer:
        near = [
            ep for ep in room if w.load[ep.id] < w.max_share and matches[ep.id] >= w.min_colocate
        ]
        if near:
            return min(near, key=lambda ep: (-matches[ep.id], *order(ep)))
    return min(room or w.replicas, key=order)
