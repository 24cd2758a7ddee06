"""How a ``Settings`` field becomes a command-line flag: value kinds (``Kind``: text, int,
boolean, duration, ...), the ``Flag`` a field declares, and :func:`flag` to declare one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from epp.plugin.units import parse_duration, parse_quantity

T = TypeVar("T")


class SettingsError(ValueError):
    """A flag value, or a combination of settings, that the EPP refuses; the message is shown
    as is (the CLI prints it as an argparse error, exit code 2)."""


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "t"):
        return True
    if value in ("false", "0", "f"):
        return False
    raise SettingsError(f"invalid boolean {text!r} (use true or false)")


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _quantity(text: str) -> int:
    try:
        return parse_quantity(text)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _ports(text: str) -> tuple[int, ...]:
    # A non-number raises int()'s ValueError: argparse reports "invalid _ports value: '…'".
    ports = tuple(dict.fromkeys(int(p) for p in text.split(",") if p.strip()))
    if not all(1 <= p <= 65535 for p in ports):
        raise SettingsError("--endpoint-target-ports: ports are 1..65535")
    if not 1 <= len(ports) <= 8:
        raise SettingsError("--endpoint-target-ports takes 1 to 8 ports")
    return ports


def _paths(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _text_or_none(text: str) -> str | None:
    return text or None


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise SettingsError(f"expected a fraction from 0 to 1, got {text}")
    return value


@dataclass(frozen=True)
class Kind:
    """How one flag's text becomes a field value. ``parse`` raises :class:`SettingsError` with a
    message to show, or a plain ``ValueError`` (argparse then says "invalid <parse> value")."""

    parse: Callable[[str], Any]
    metavar: str | None = None
    """``None``: the flag name in capitals, as argparse shows it."""
    optional_value: bool = False
    """Go-style boolean: ``--flag`` alone means true, ``--flag=false`` also works."""
    repeat: bool = False
    """The flag may be given several times; the tuples ``parse`` returns are concatenated."""


TEXT: Final = Kind(str)
OPTIONAL_TEXT: Final = Kind(_text_or_none)
"""Text where an empty value means ``None``."""
INT: Final = Kind(int)
BOOL: Final = Kind(_bool, metavar="BOOL", optional_value=True)
FRACTION: Final = Kind(_fraction)
"""A number from 0 to 1."""
DURATION: Final = Kind(_duration)
"""Go durations (``50ms``, ``1m30s``) → seconds."""
QUANTITY: Final = Kind(_quantity)
"""Quantities (``10MiB``, ``25MB``) → an int."""
PORTS: Final = Kind(_ports)
"""Comma-separated ports, 1 to 8, duplicates dropped."""
PATHS: Final = Kind(_paths, metavar="PATH[,PATH]", repeat=True)
"""Paths, repeatable and comma-separated."""
NAMES: Final = Kind(_paths, metavar="NAME[,NAME]", repeat=True)
"""Names, repeatable and comma-separated (Go's ``StringSlice``)."""

@dataclass(frozen=True)
class Flag:
    """The command-line flag of one ``Settings`` field."""

    name: str
    """Long name without dashes (``grpc-port``)."""
    help: str
    kind: Kind
    short: str = ""
    """One-letter alias without the dash (``v``), or empty."""
    compat: str = ""
    """Non-empty: the flag is accepted for compatibility only and does nothing; this says so
    in a startup warning (``epp.cli``) when the flag is given."""

    @property
    def option_strings(self) -> list[str]:
        long = f"--{self.name}"
        return [f"-{self.short}", long] if self.short else [long]

    @property
    def metavar(self) -> str:
        return self.kind.metavar or self.name.upper().replace("-", "_")


_FLAG_KEY: Final = "epp.flag"


def flag(default: T, help: str, kind: Kind = TEXT, *, name: str = "", short: str = "") -> T:
    """A ``Settings`` field that is also a command-line flag. ``name`` defaults to the field name
    with ``-`` for ``_`` (filled in by :func:`flag_of`). Boolean flags get "(default x)" added to
    their help."""
    if kind.optional_value:
        help = f"{help} (default {str(default).lower()})"
    spec = Flag(name=name, help=help, kind=kind, short=short)
    result: T = dataclasses.field(default=default, metadata={_FLAG_KEY: spec})
    return result
