"""Parser of the Prometheus text exposition format (version 0.0.4).

This is what vLLM, SGLang, trtllm-serve and Triton serve on ``/metrics``. The collector scrapes
every endpoint every 50 ms, so the parser is built to be cheap:

* ``parse(text, wanted)`` only parses the series whose metric name is in ``wanted``. With a
  ``wanted`` set it never walks the payload line by line in Python: for each wanted name it jumps
  to the lines starting with that name (``bytes.find``) and decodes only those lines.
* ``LineCache`` is the same parse with memory, for a scraper that reads the same pages every
  50 ms: one compiled pattern per ``wanted`` set finds the wanted lines in one C-speed pass, and
  the name and labels of each series already seen are reused instead of parsed again (a pod's
  ``cache_config_info`` line alone carries some forty labels); only the value is read anew. It
  is keyed by the series (the line up to its value), not by the whole line: keyed by line, every
  new value of a counter or gauge was a new entry, so the cache kept filling with lines never
  seen again (a few MB per cache before it started over, which a soak saw as RSS growth after the
  warm-up); keyed by series it holds one entry per series the pods expose. The cache is bounded
  in entries and bytes and starts over when full; its results equal ``parse``'s.
* Results are keyed by the series name as written (``foo_bucket``, ``foo_sum`` and ``foo_count``
  of a histogram or summary stay separate keys), so a metric spec names exactly what it reads.

Accepted syntax per line::

    # HELP name text          (ignored)
    # TYPE name gauge         (ignored)
    name{label="value",...} value [timestamp_ms]

Label values understand the escapes ``\\\\``, ``\\"`` and ``\\n``; values may be ``NaN``,
``+Inf`` or ``-Inf``; the timestamp is an optional integer in milliseconds. A line that does not
follow the syntax is skipped and counted in ``Families.skipped``.

Lines indented with whitespace are accepted by the full parse (``wanted=None``) but not found by
the ``wanted`` fast path; no model server indents its exposition.

Example::

    families = parse(payload, frozenset({"vllm:num_requests_waiting"}))
    for sample in families.get("vllm:num_requests_waiting", []):
        print(sample.labels, sample.value)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

_METRIC_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES: Final[dict[str, str]] = {"\\": "\\", '"': '"', "n": "\n"}
_NAME_ENDS: Final = (ord("{"), ord(" "), ord("\t"))
_NAME_END: Final = re.compile(rb"[{ \t]")
_BRACE: Final = ord("{")


@dataclass(frozen=True, slots=True)
class Sample:
    """One series value: ``name{labels} value [timestamp_ms]``."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None = None


class Families(dict[str, list[Sample]]):
    """Samples grouped by series name, in payload order; ``skipped`` counts malformed lines."""

    skipped: int

    def __init__(self) -> None:
        super().__init__()
        self.skipped = 0


class _Malformed(ValueError):
    pass


class _Mark:
    """What the line cache answers besides samples: a malformed line."""

    __slots__ = ()


_MALFORMED: Final = _Mark()
_Cached = Sample | None | _Mark


class _Series:
    """A cached series (the line up to its value): its last value bytes and its last sample."""

    __slots__ = ("rest", "sample")

    def __init__(self, rest: bytes, sample: Sample) -> None:
        self.rest = rest
        self.sample = sample


class LineCache:
    """``parse(text, wanted)`` with memory: the result is the same, but the name and labels of a
    series seen before (same bytes up to the value) are not parsed again, only its value. Label
    dicts are shared between results: treat samples as read-only.

    Bounded: at most ``max_lines`` series of at most ``max_line_bytes`` each, ``max_bytes`` in
    all (longer lines are parsed every time); when full it starts over. At most
    ``max_patterns`` compiled patterns (one per distinct ``wanted`` set) are kept, likewise.
    """

    def __init__(
        self,
        *,
        max_lines: int = 8192,
        max_line_bytes: int = 4096,
        max_bytes: int = 2 * 1024 * 1024,
        max_patterns: int = 64,
    ) -> None:
        self._series: dict[bytes, _Series] = {}
        self._bytes = 0
        self._max_bytes = max_bytes
        self._patterns: dict[frozenset[str], re.Pattern[bytes]] = {}
        self._max_lines = max_lines
        self._max_line_bytes = max_line_bytes
        self._max_patterns = max_patterns

    def parse(self, text: bytes, wanted: frozenset[str]) -> Families:
        families = Families()
        if not wanted:
            return families
        # The leading newline lets the first line match the same "\n<name>" as every other.
        for match in self._pattern(wanted).finditer(b"\n" + text):
            sample = self._sample(match.group(1))
            if isinstance(sample, Sample):
                found = families.get(sample.name)
                if found is None:
                    families[sample.name] = [sample]
                else:
                    found.append(sample)
            elif sample is _MALFORMED:
                families.skipped += 1
        return families

    def _sample(self, raw: bytes) -> _Cached:
        """The line's sample: the series' last sample when its value bytes are unchanged, else
        its cached name and labels with the value parsed anew, or the whole line parsed (and its
        series cached) the first time."""
        end = _series_end(raw)
        key, rest = raw[:end], raw[end:]
        entry = self._series.get(key)
        if entry is not None:
            if entry.rest == rest:
                return entry.sample
            try:
                value, timestamp = _parse_value(rest.decode("utf-8", "replace"), 0)
            except _Malformed:
                return _MALFORMED
            last = entry.sample
            entry.rest, entry.sample = rest, Sample(last.name, last.labels, value, timestamp)
            return entry.sample
        try:
            sample = parse_line(raw.decode("utf-8", "replace"))
        except _Malformed:
            return _MALFORMED
        if sample is not None and end <= self._max_line_bytes:
            if len(self._series) >= self._max_lines or self._bytes + end > self._max_bytes:
                self._series.clear()
                self._bytes = 0
            self._series[key] = _Series(rest, sample)
            self._bytes += end
        return sample

    def _pattern(self, wanted: frozenset[str]) -> re.Pattern[bytes]:
        pattern = self._patterns.get(wanted)
        if pattern is None:
            if len(self._patterns) >= self._max_patterns:
                self._patterns.clear()
            pattern = self._patterns[wanted] = wanted_lines_pattern(wanted)
        return pattern


def _series_end(raw: bytes) -> int:
    """Where a line's value starts: after the ``}`` closing its labels (the last one: a label
    value may hold ``}``, a value or timestamp may not), else at the blank ending its name. A
    line whose value holds ``}`` is malformed; it is parsed whole, never cached."""
    found = _NAME_END.search(raw)
    if found is None:
        return len(raw)
    if raw[found.start()] != _BRACE:
        return found.start()
    return raw.rfind(b"}") + 1 or len(raw)


def wanted_lines_pattern(wanted: Iterable[str]) -> re.Pattern[bytes]:
    """Matches ``\n<name>`` followed by ``{``, a space or a tab, for each wanted name; group 1
    is the line without its newline (what ``_wanted_lines`` yields, undecoded)."""
    # Longest first, so a name that prefixes another is tried after it (either way only the
    # name followed by a name end matches).
    names = sorted({n.encode() for n in wanted}, key=lambda n: (-len(n), n))
    alternatives = b"|".join(re.escape(n) for n in names)
    return re.compile(b"\n((?:" + alternatives + b")[{ \t][^\n]*)")


def parse(text: bytes, wanted: frozenset[str] | None = None) -> Families:
    """Parse an exposition payload, keeping only series named in ``wanted`` (all when None)."""
    families = Families()
    lines = _all_lines(text) if wanted is None else _wanted_lines(text, wanted)
    for line in lines:
        try:
            sample = parse_line(line)
        except _Malformed:
            families.skipped += 1
            continue
        if sample is not None:
            families.setdefault(sample.name, []).append(sample)
    return families


def parse_line(line: str) -> Sample | None:
    """One sample from one line; None for blank and comment lines; ``ValueError`` if malformed."""
    line = line.strip()
    if not line or line[0] == "#":
        return None
    match = _METRIC_NAME.match(line)
    if match is None:
        raise _Malformed(f"bad metric name in {line!r}")
    name = match.group()
    pos = match.end()
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        pos = _parse_labels(line, pos + 1, labels)
    elif pos < len(line) and line[pos] not in " \t":
        raise _Malformed(f"bad metric name in {line!r}")
    return Sample(name, labels, *_parse_value(line, pos))


def _all_lines(text: bytes) -> Iterator[str]:
    yield from text.decode("utf-8", "replace").splitlines()


def _wanted_lines(text: bytes, wanted: Iterable[str]) -> Iterator[str]:
    """Lines that start with one of the wanted names, found with C-speed ``bytes.find``."""
    # A leading newline lets the first line match the same "\n<name>" needle as every other.
    padded = b"\n" + text
    size = len(padded)
    for name in wanted:
        needle = b"\n" + name.encode()
        pos = padded.find(needle)
        while pos != -1:
            after = pos + len(needle)
            end = padded.find(b"\n", after)
            if end == -1:
                end = size
            # The byte after the name must end it, else this is a longer name sharing the prefix.
            if after < size and padded[after] in _NAME_ENDS:
                yield padded[pos + 1 : end].decode("utf-8", "replace")
            pos = padded.find(needle, end)


def _parse_labels(line: str, pos: int, labels: dict[str, str]) -> int:
    """Parse ``name="value",...}`` starting after ``{``; return the index after ``}``."""
    size = len(line)
    while True:
        pos = _skip_blanks(line, pos)
        if pos < size and line[pos] == "}":
            return pos + 1
        match = _LABEL_NAME.match(line, pos)
        if match is None:
            raise _Malformed(f"bad label name in {line!r}")
        key = match.group()
        pos = _skip_blanks(line, match.end())
        if pos >= size or line[pos] != "=":
            raise _Malformed(f"missing '=' after label {key!r}")
        pos = _skip_blanks(line, pos + 1)
        if pos >= size or line[pos] != '"':
            raise _Malformed(f"label {key!r} value is not quoted")
        value, pos = _parse_quoted(line, pos + 1)
        if key in labels:
            raise _Malformed(f"duplicate label {key!r}")
        labels[key] = value
        pos = _skip_blanks(line, pos)
        if pos < size and line[pos] == ",":
            pos += 1
        elif pos >= size or line[pos] != "}":
            raise _Malformed(f"expected ',' or '}}' after label {key!r}")


def _parse_quoted(line: str, pos: int) -> tuple[str, int]:
    """Read an escaped label value starting after its opening quote."""
    parts: list[str] = []
    while True:
        quote = line.find('"', pos)
        if quote == -1:
            raise _Malformed("unterminated label value")
        backslash = line.find("\\", pos, quote)
        if backslash == -1:
            parts.append(line[pos:quote])
            return "".join(parts), quote + 1
        parts.append(line[pos:backslash])
        escaped = line[backslash + 1 : backslash + 2]
        if escaped not in _ESCAPES:
            raise _Malformed(f"invalid escape '\\{escaped}'")
        parts.append(_ESCAPES[escaped])
        pos = backslash + 2


def _parse_value(line: str, pos: int) -> tuple[float, int | None]:
    fields = line[pos:].split()
    if not fields or len(fields) > 2:
        raise _Malformed(f"expected 'value [timestamp]' in {line!r}")
    if "_" in fields[0]:
        # Python's float() accepts digit separators; the exposition format does not.
        raise _Malformed(f"bad value in {line!r}")
    try:
        value = float(fields[0])
        timestamp = int(fields[1]) if len(fields) == 2 else None
    except ValueError:
        raise _Malformed(f"bad value or timestamp in {line!r}") from None
    return value, timestamp


def _skip_blanks(line: str, pos: int) -> int:
    size = len(line)
    while pos < size and line[pos] in " \t":
        pos += 1
    return pos
