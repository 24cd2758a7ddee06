"""The union of the workers' ``/metrics`` pages: one page, every sample labelled with its worker.

Each worker serves its own registry on a private port, in Prometheus text format 0.0.4. The union
keeps every family exactly as a single process names and describes it (the same ``# HELP`` and
``# TYPE`` lines, the same sample names) and adds one label, ``worker="<index>"``, to every
sample. Each family appears once, its samples from all workers together (the text format
requires a family's samples to be contiguous). Summing over ``worker`` gives the single-process
series of counters and histograms; gauges that every worker reports alike (the pool gauges,
which each worker computes from the same scraped pods) read the same value on each worker.

The index is the worker's slot (0..N-1), not its pid: a restarted worker keeps its series, whose
counters then restart from 0, which Prometheus's ``rate()`` treats as a counter reset.

This is text rewriting, not re-encoding, so values and float formatting pass through unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

WORKER_LABEL: Final = "worker"
_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@dataclass
class _Family:
    help: str = ""
    type: str = ""
    samples: list[str] = field(default_factory=list)


def labelled(line: str, label: str) -> str:
    """A sample line with ``label`` (``name="value"``) as its first label."""
    m = _NAME.match(line)
    if m is None:
        return line
    name, rest = m.group(), line[m.end() :]
    if rest.startswith("{}"):
        return f"{name}{{{label}}}{rest[2:]}"
    if rest.startswith("{"):
        return f"{name}{{{label},{rest[1:]}"
    return f"{name}{{{label}}}{rest}"


def _header(line: str) -> tuple[str, str] | None:
    """``(kind, family)`` of a ``# HELP``/``# TYPE`` line, else ``None``."""
    parts = line.split(None, 3)
    if len(parts) >= 3 and parts[0] == "#" and parts[1] in ("HELP", "TYPE"):
        return parts[1], parts[2]
    return None


def _add_page(families: dict[str, _Family], text: str, label: str) -> None:
    current = ""
    for line in text.splitlines():
        header = _header(line)
        if header is not None:
            kind, current = header
            family = families.setdefault(current, _Family())
            if kind == "HELP" and not family.help:
                family.help = line
            elif kind == "TYPE" and not family.type:
                family.type = line
        elif line.strip() and not line.startswith("#"):
            if not current:  # a sample before any header is a family of its own, untyped
                m = _NAME.match(line)
                current = m.group() if m else ""
            families.setdefault(current, _Family()).samples.append(labelled(line, label))


def union(pages: Mapping[int, str]) -> str:
    """One text page from each worker's page (keyed by worker index), in index order."""
    families: dict[str, _Family] = {}
    for index in sorted(pages):
        _add_page(families, pages[index], f'{WORKER_LABEL}="{index}"')
    out: list[str] = []
    for family in families.values():
        out.extend(h for h in (family.help, family.type) if h)
        out.extend(family.samples)
    return "\n".join(out) + "\n" if out else ""
