"""Go-style durations (``50ms``, ``1m30s``) and Kubernetes-style quantities (``10MiB``, ``1Gi``,
``25MB``, ``1k``), as upstream's flags and config accept them."""

from __future__ import annotations

import re
from typing import Final

_DURATION_UNITS: Final = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")

_QUANTITY_SUFFIX: Final = {
    "": 1,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "KB": 10**3,
    "kB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
    "B": 1,
}
_QUANTITY: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_duration(text: str) -> float:
    """Seconds from a Go duration string; ``"0"`` is zero. Raises ValueError with the input."""
    s = text.strip()
    sign = 1.0
    if s[:1] in ("+", "-"):
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"invalid duration {text!r} (examples: 50ms, 30s, 1m30s)")
    pos = 0
    total = 0.0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None:
            raise ValueError(f"invalid duration {text!r} (examples: 50ms, 30s, 1m30s)")
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    return sign * total


def parse_quantity(text: str | int) -> int:
    """Bytes/count from a quantity (``10MiB``, ``1Gi``, ``25MB``, ``5000``)."""
    if isinstance(text, int):
        return text
    m = _QUANTITY.match(text)
    if m is None or m.group(2) not in _QUANTITY_SUFFIX:
        raise ValueError(f"invalid quantity {text!r} (examples: 5000, 10MiB, 1Gi, 25MB)")
    return int(float(m.group(1)) * _QUANTITY_SUFFIX[m.group(2)])
