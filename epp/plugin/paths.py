"""Request paths as parsers claim them: whole-segment suffixes, compared without the query.

A parser's ``claims()`` are path suffixes made of whole segments (``chat/completions``); the
framework's parser router and the parsers themselves match them with ``SuffixTable``, so both
agree on what a claim means: ``/v1/chat/completions`` matches ``chat/completions`` and
``completions``, and the longest claim wins; ``/v1/xcompletions`` matches neither.

gRPC paths are ``/<package>.<Service>/<Method>``: a segment followed by another one also matches
by its part after the last dot, so the claim ``PredictionService/ChatCompletions`` matches
``/google.cloud.aiplatform.v1.PredictionService/ChatCompletions`` (the full name matches too:
``vllm.grpc.engine.VllmEngine/Generate``). The last segment is always compared whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


def normalize_suffix(path: str) -> str:
    return path.strip().strip("/")


class SuffixTable(Generic[T]):
    """Maps path suffixes made of whole segments (``chat/completions``) to values.

    A lookup walks the path's trailing segments from the right, one dictionary probe per segment
    and never deeper than the longest key, so its cost does not grow with the number of keys. The
    longest matching suffix wins; for equal keys the first one added is kept.
    """

    def __init__(self, entries: Iterable[tuple[str, T]]) -> None:
        self._by_suffix: dict[str, T] = {}
        self._depth = 0
        for suffix, value in entries:
            key = normalize_suffix(suffix)
            if not key:
                continue
            self._by_suffix.setdefault(key, value)
            self._depth = max(self._depth, key.count("/") + 1)

    def __len__(self) -> int:
        return len(self._by_suffix)

    def lookup(self, path: str) -> T | None:
        """``path`` must already be query-free; surrounding blanks and one trailing ``/`` are
        ignored."""
        path = path.strip()
        if path.endswith("/"):
            path = path[:-1]
        found: T | None = None
        end = len(path)
        for _ in range(self._depth):
            start = path.rfind("/", 0, end)
            hit = self._by_suffix.get(path[start + 1 :])
            if hit is None and end < len(path):
                dot = path.rfind(".", start + 1, end)
                if dot >= 0:  # a gRPC service segment, by its unqualified name
                    hit = self._by_suffix.get(path[dot + 1 :])
            if hit is not None:
                found = hit
            if start < 0:
                break
            end = start
        return found


def strip_query(path: str) -> str:
    cut = path.find("?")
    return path if cut < 0 else path[:cut]
