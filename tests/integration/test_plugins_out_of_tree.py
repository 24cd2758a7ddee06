"""A third-party plugin package, really installed (pip, entry points), used from YAML."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BIN = Path(sys.executable).parent


def pip_install(target: Path, package: str) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(FIXTURES / package),
        ],
        check=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def testplugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    pip_install(target, "epp-testplugins")
    return target


def run(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=60, cwd=FIXTURES.parents[1]
    )


def test_plugins_list_shows_third_party_type_distribution_and_version(testplugins: Path) -> None:
    out = run(testplugins, str(BIN / "epp"), "plugins", "list")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:3] for line in out.stdout.splitlines()[1:]}
    assert rows["test-constant-scorer"] == ["epp-testplugins", "0.1.0"]
    assert rows["queue-scorer"][0] == "inference-epp"


def test_third_party_scorer_is_used_from_yaml(testplugins: Path) -> None:
    code = """
import textwrap
from epp.config.loader import load_config
from epp.plugin.registry import PluginRegistry
from tests.builders import handle, make_endpoint, make_request, make_cycle
text = textwrap.dedent('''
    apiVersion: llm-d.ai/v1alpha1
    kind: EndpointPickerConfig
    plugins:
    - name: pin
      type: test-constant-scorer
      parameters: {value: 1.0, ports: [8002]}
    ''')
p = load_config(text, registry=PluginRegistry.from_entry_points(), handle_for=handle)
scorer, weight = p.profiles["default"].scorers[0]
eps = [make_endpoint(0, port=8001), make_endpoint(1, port=8002)]
print(type(scorer).__module__, weight, dict(scorer.score(make_cycle(), make_request(), eps)))
"""
    out = run(testplugins, sys.executable, "-c", code)
    assert out.returncode == 0, out.stderr
    module, weight, scores = out.stdout.strip().split(" ", 2)
    assert module == "epp_testplugins" and weight == "1.0"
    assert scores == "{'default/pod-0-rank-0': 0.0, 'default/pod-1-rank-0': 1.0}"


def test_bad_third_party_params_fail_with_plugin_type_and_path(testplugins: Path) -> None:
    cfg = (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        "- name: pin\n  type: test-constant-scorer\n  parameters: {value: 3}\n"
    )
    out = run(testplugins, str(BIN / "epp"), "--config-text", cfg, "--grpc-port", "0")
    assert out.returncode == 2
    assert (
        "plugin 'pin' (type 'test-constant-scorer'): parameters: value must be in [0, 1]"
        in out.stderr
    )


def test_duplicate_type_across_distributions_is_a_startup_error_that_the_list_reports(
    tmp_path: Path, testplugins: Path
) -> None:
    pip_install(tmp_path, "epp-dupplugin")
    out = run(tmp_path, str(BIN / "epp"), "--grpc-port", "0")
    assert out.returncode == 2
    assert "plugin type 'queue-scorer' is registered twice" in out.stderr
    assert "epp-dupplugin 0.2.0" in out.stderr and "inference-epp" in out.stderr

    listed = run(tmp_path, str(BIN / "epp"), "plugins", "list")
    assert listed.returncode == 0, listed.stderr
    assert "plugin type 'queue-scorer' is registered twice" in listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    claims = sorted(r[1] for r in rows if r[0] == "queue-scorer")
    assert claims == ["epp-dupplugin", "inference-epp"]
    assert all(r[-1] == "CLASH" for r in rows if r[0] == "queue-scorer")
    assert any(r[0] == "prefix-cache-scorer" and r[-1] != "CLASH" for r in rows)
