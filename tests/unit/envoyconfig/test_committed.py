"""The Envoy and Istio configs committed under deploy/ are ``epp envoy-config`` output: each
names its command line in a ``# Generated:`` comment, and stays identical to what the command
prints now; the Envoy configs pass ``envoy --mode validate``."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from epp.envoyconfig.cli import generate, parser
from tests.unit.envoyconfig.validate import validate

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
MARK = "# Generated: epp envoy-config "
FILES = sorted(p for p in DEPLOY.rglob("*.yaml") if p.is_file() and MARK in p.read_text())


def _split(path: Path) -> tuple[list[str], str]:
    lines = path.read_text().splitlines(keepends=True)
    command = next(line for line in lines if line.startswith(MARK))
    body = "".join(line for line in lines if not line.startswith("#"))
    return shlex.split(command[len(MARK) :]), body


def test_the_generated_configs_are_found() -> None:
    names = {str(p.relative_to(DEPLOY)) for p in FILES}
    assert {
        "envoy/full-duplex.yaml",
        "envoy/buffered-failopen.yaml",
        "envoy/istio-envoyfilter.yaml",
        "kubernetes/standalone/envoy.yaml",
    } <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_committed_config_is_the_commands_output(path: Path) -> None:
    args, body = _split(path)
    expected = generate(parser().parse_args(args))
    assert body == expected, (
        f"{path} is stale: regenerate it with `epp envoy-config {shlex.join(args)}`"
    )


@pytest.mark.envoy
@pytest.mark.parametrize(
    "path", [p for p in FILES if "--istio" not in _split(p)[0]], ids=lambda p: p.name
)
def test_committed_envoy_config_passes_envoy_validate(path: Path, tmp_path: Path) -> None:
    validate(path.read_text(), tmp_path / "envoy.yaml")
