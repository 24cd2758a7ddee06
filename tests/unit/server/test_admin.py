"""The admin API's bearer token: read once at startup, an unreadable or empty file stops it."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.config.loader import ConfigError
from epp.server.admin import read_token


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
