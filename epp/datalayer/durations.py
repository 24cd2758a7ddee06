"""Go-style duration strings (``"50ms"``, ``"1.5s"``, ``"1m30s"``) as used in upstream configs.

``parse_duration`` returns seconds as a float. Accepted units: ``ns``, ``us`` (``µs``), ``ms``,
``s``, ``m``, ``h``; a bare ``"0"`` is zero; a leading sign is allowed as in Go. Anything else
raises ``ValueError`` naming the input.
"""

from __future__ import annotations

import re
from typing import Final

_UNIT_SECONDS: Final[dict[str, float]] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}

# Longest unit spellings first so "ms" is not read as "m" followed by garbage.
_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds represented by the Go duration ``text``."""
    raw = text.strip()
    body = raw.lstrip("+-")
    sign = -1.0 if raw.startswith("-") else 1.0
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    pos = 0
    while pos < len(body):
        match = _PART.match(body, pos)
        if match is None:
            raise ValueError(f"invalid duration {text!r} (expected e.g. '50ms', '1s', '1m30s')")
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    return sign * total
