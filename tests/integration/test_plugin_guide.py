"""The "Writing a plugin" guide (docs/writing-plugins.md), followed literally: every file it shows
is the file of ``conformance/example_plugin``, its commands run (the package installed with pip,
listed, its contract tests passing), and its config routes through a real Envoy with the installed
plugins. The package's Dockerfile is checked by parsing (no Docker here) and its install
step run."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from epp.plugin.registry import PluginRegistry
from tests.conftest import COMPLETION, post, set_overrides, settle

pytestmark = [pytest.mark.envoy]
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "conformance" / "example_plugin"
BIN = Path(sys.executable).parent
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.M | re.S)


def guide() -> list[tuple[str, dict[str, str], str]]:
    """The guide's code blocks: (language, attributes such as ``file``, text)."""
    section = (REPO / "docs" / "writing-plugins.md").read_text()
    out = []
    for lang, attrs, body in BLOCK.findall(section):
        out.append((lang, dict(a.split("=", 1) for a in attrs.split() if "=" in a), body))
    return out


def _env(site: Path) -> dict[str, str]:
    """pip installs into ``site`` (which Python then sees) instead of the test environment."""
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(site),
        "PIP_TARGET": str(site),
        "PIP_NO_DEPS": "1",
        "PIP_NO_BUILD_ISOLATION": "0",  # pip reads this as --no-build-isolation (offline build)
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTEST_ADDOPTS": "-p no:cacheprovider",
    }


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The guide's shell commands, run in order from the repository root."""
    site = tmp_path_factory.mktemp("site")
    commands = [body for lang, _, body in guide() if lang == "sh"]
    assert commands, "the guide has no commands"
    out = ""
    for body in commands:
        command = ["bash", "-e", "-o", "pipefail", "-c", body]
        run = subprocess.run(
            command, cwd=REPO, env=_env(site), capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, f"{body}\n{run.stdout}\n{run.stderr}"
        out += run.stdout
    return site, out


def test_every_file_the_guide_shows_is_the_example_packages_file() -> None:
    shown = {attrs["file"]: body for _, attrs, body in guide() if "file" in attrs}
    for name, body in shown.items():
        assert (REPO / name).read_text() == body, f"docs/writing-plugins.md and {name} differ"
    package = {
        str(p.relative_to(REPO))
        for p in EXAMPLE.rglob("*")
        if p.suffix in (".py", ".toml", ".yaml")
    }
    package -= {"conformance/example_plugin/epp_example_plugin/__init__.py"}
    assert set(shown) == package


def test_the_guides_commands_install_list_and_test_the_package(followed: tuple[Path, str]) -> None:
    site, out = followed
    assert (site / "epp_example_plugin" / "scorer.py").exists()
    listed = {
        line.split()[0]: line.split()[1:3]
        for line in out.splitlines()
        if line.startswith("example-")
    }
    assert listed == {
        "example-label-scorer": ["epp-example-plugin", "0.1.0"],
        "example-max-queue-filter": ["epp-example-plugin", "0.1.0"],
    }
    assert "2 passed" in out


async def test_the_guides_config_routes_through_envoy_with_the_installed_plugins(
    followed: tuple[Path, str], start_app, sim_pods, envoy, monkeypatch: pytest.MonkeyPatch
) -> None:
    site, _ = followed
    monkeypatch.syspath_prepend(str(site))
    registry = PluginRegistry.from_entry_points()
    assert registry.info("example-label-scorer").distribution == "epp-example-plugin"
    fleet = await sim_pods(3)
    # pod-0: gold, the emptiest KV cache, but over the filter's queue limit: it would win
    # without the filter. pod-1: gold, a full cache. pod-2: not gold: it would win without the
    # scorer. With both plugins every request goes to pod-1.
    for url, waiting, kv in zip(fleet.urls, [9, 1, 0], [0.0, 0.9, 0.5], strict=True):
        await set_overrides(url, num_requests_waiting=waiting, kv_cache_usage_perc=kv)
    labels = {0: {"tier": "gold"}, 1: {"tier": "gold"}}
    body = (EXAMPLE / "example-config.yaml").read_text().split("plugins:\n", 1)[1]
    app = await start_app(fleet.ports, "plugins:\n" + body, labels=labels, registry=registry)
    await settle(app, lambda m: all(x is not None and x.waiting_queue_size in (9, 1, 0)
                                    and x.update_time for x in m.values()))  # fmt: skip
    proxy = envoy(app)
    served: Counter[str] = Counter()
    for _ in range(6):
        status, headers, text = await post(f"{proxy.url}/v1/completions", COMPLETION)
        assert status == 200, text
        served[headers["x-sim-pod"]] += 1
    assert served == {"pod-1": 6}


def _instructions(path: Path) -> list[tuple[str, str]]:
    """A Dockerfile's instructions (continuations joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", "\n".join(
        line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
    ))  # fmt: skip
    return [
        (w[0].upper(), w[1].strip())
        for w in (line.split(None, 1) for line in text.splitlines())
        if w
    ]


def test_the_example_dockerfile_adds_the_package_as_root_and_runs_as_the_epps_user(
    tmp_path: Path,
) -> None:
    steps = _instructions(EXAMPLE / "Dockerfile")
    kinds = [k for k, _ in steps]
    assert kinds[:2] == ["ARG", "FROM"] and steps[1][1] == "${EPP_IMAGE}"
    assert steps[0][1].startswith("EPP_IMAGE=")
    epp_stage = (REPO / "deploy" / "Dockerfile").read_text().split(" AS epp\n", 1)[1]
    epp_user = re.findall(r"^USER (\S+)", epp_stage, re.M)[-1]
    assert epp_user == "65532:65532"
    users = [(i, arg) for i, (k, arg) in enumerate(steps) if k == "USER"]
    runs = [i for i, (k, arg) in enumerate(steps) if k == "RUN" and "pip install" in arg]
    assert users[-1][1] == epp_user and users[-1][0] == len(steps) - 1  # ends as the EPP's user
    assert runs and all(users[0][1] == "root" and users[0][0] < i < users[-1][0] for i in runs)
    assert not {"ENTRYPOINT", "CMD"} & set(kinds)  # the EPP's own entrypoint
    # The install step, run here: COPY's destination is the package folder.
    (copy,) = [arg.split() for k, arg in steps if k == "COPY"]
    assert copy[0] == "."
    (run,) = [arg for k, arg in steps if k == "RUN"]
    install = run.split("&&")[0].replace(copy[1], str(EXAMPLE))
    assert "--no-deps" in shlex.split(install) and "--no-cache-dir" in shlex.split(install)
    done = subprocess.run(shlex.split(install), env={**_env(tmp_path), "PIP_NO_DEPS": ""},
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "epp_example_plugin" / "filter.py").exists()


def test_deploy_dockerfile_documents_adding_a_plugin_package() -> None:
    text = (REPO / "deploy" / "Dockerfile").read_text()
    recipe = [line[4:] for line in text.splitlines() if line.startswith("#   ")]
    start = next(i for i, line in enumerate(recipe) if line.startswith("FROM inference-epp"))
    steps = recipe[start : start + 4]
    assert steps[1] == "USER root" and steps[2].startswith(
        "RUN pip install --no-cache-dir --no-deps"
    )
    assert steps[3] == "USER 65532:65532"
    assert "conformance/example_plugin/Dockerfile" in text
