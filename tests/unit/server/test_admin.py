"""The admin API's auth: its own token file (read once at startup; an unreadable or empty file
stops it) and the debug views' reviewer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from epp.config.loader import ConfigError
from epp.observability.auth import Verdict
from epp.server.admin import (
    PERMISSION_DENIED,
    UNAUTHENTICATED,
    UNAVAILABLE,
    AdminError,
    AdminServicer,
    AdminSources,
    read_token,
)


def test_no_file_means_no_token() -> None:
    assert read_token("") == ""


def test_the_token_is_the_files_stripped_text(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("  abc\n")
    assert read_token(str(tmp_path / "t")) == "abc"


def test_an_empty_or_missing_file_stops_startup_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="holds no token"):
        read_token(str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="admin-token-file"):
        read_token(str(tmp_path / "missing"))


class _Reviewer:
    def __init__(self, status: int | Exception) -> None:
        self.status = status
        self.asked: list[tuple[str, str, str]] = []

    async def review(self, token: str, path: str, verb: str) -> Verdict:
        self.asked.append((token, path, verb))
        if isinstance(self.status, Exception):
            raise self.status
        return Verdict(self.status)


def _servicer(token: str = "", reviewer: _Reviewer | None = None) -> AdminServicer:
    sources = AdminSources(director=None, endpoints=list, dumpers=())  # type: ignore[arg-type]
    return AdminServicer(dataclasses.replace(sources, token=token, reviewer=reviewer))


async def _code(servicer: AdminServicer, authorization: str | None) -> int | None:
    try:
        await servicer._authorize(authorization or "")
    except AdminError as err:
        return err.code
    return None


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param(200, None, id="allowed"),
        pytest.param(401, UNAUTHENTICATED, id="unknown-token"),
        pytest.param(403, PERMISSION_DENIED, id="not-granted"),
        pytest.param(RuntimeError("api server down"), UNAVAILABLE, id="failed"),
    ],
)
async def test_the_debug_reviewer_judges_admin_calls_as_a_get_of_debug_admin(
    status: int | Exception, expected: int | None
) -> None:
    reviewer = _Reviewer(status)
    assert await _code(_servicer(reviewer=reviewer), "Bearer t0k") == expected
    assert reviewer.asked == [("t0k", "/debug/admin", "get")]


async def test_the_admin_token_is_accepted_without_asking_the_reviewer() -> None:
    reviewer = _Reviewer(403)
    servicer = _servicer(token="own", reviewer=reviewer)
    assert await _code(servicer, "Bearer own") is None
    assert reviewer.asked == []
    assert await _code(servicer, None) == UNAUTHENTICATED
    assert await _code(_servicer(), None) is None  # nothing configured: open, as /debug is
