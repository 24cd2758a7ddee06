"""Reproducible builds: constraints.txt pins every dependency pyproject.toml declares (runtime,
``test`` and ``dev``, and the tools' in tools/pyproject.toml) to a version its specifier allows;
the Dockerfile and .ci/run install under those pins; the linters are in ``dev``, not ``test``;
.dockerignore keeps the repository's history, virtual environments and caches out of the build
context but nothing the Dockerfile copies. The service ships alone: its wheel and its image hold
no tool module."""

from __future__ import annotations

import fnmatch
import re
import tomllib
import zipfile
from pathlib import Path

from hatchling.builders.wheel import WheelBuilder
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
TOOLS = tomllib.loads((ROOT / "tools" / "pyproject.toml").read_text())["project"]
TOOL_PATHS = ("epp_tools/", "epp/sim/", "epp/bench/", "epp/localstack/", "epp/stack/")
"""Where a tool module sits in a wheel: the tools' package, or where the tools once were."""


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and re.fullmatch(r"[\w.+!-]+", version), f"not a pin: {line!r}"
            assert canonicalize_name(name) not in pins, f"pinned twice: {name}"
            pins[canonicalize_name(name)] = version
    return pins


def _declared() -> list[Requirement]:
    extras = PROJECT["optional-dependencies"]
    tools = [r for r in TOOLS["dependencies"] if Requirement(r).name != PROJECT["name"]]
    declared = [*PROJECT["dependencies"], *extras["test"], *extras["dev"], *tools]
    return [Requirement(r) for r in declared]


def test_constraints_pin_every_declared_dependency_within_its_specifier() -> None:
    pins = _pins()
    assert canonicalize_name(PROJECT["name"]) not in pins  # the project itself is not pinned
    for req in _declared():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned: regenerate constraints.txt (its header)"
        assert req.specifier.contains(pins[name], prereleases=True), (str(req), pins[name])


def test_linters_are_dev_tools_and_tests_need_none_of_them() -> None:
    extras = PROJECT["optional-dependencies"]
    dev = {canonicalize_name(Requirement(r).name) for r in extras["dev"]}
    test = {canonicalize_name(Requirement(r).name) for r in extras["test"]}
    assert {"ruff", "mypy", "import-linter", "types-pyyaml"} <= dev
    assert not dev & test


def test_dockerfile_and_ci_install_under_the_constraints() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    # the build's own instructions; comments show plugin authors a recipe for their own image
    dockerfile = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    # Every pip command that reaches the package index is constrained.
    commands = re.findall(r"pip (?:install|wheel)[^\n]*", dockerfile)
    assert commands
    for command in commands:
        assert "--no-index" in command or "-c " in command, command
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"pip install .*-c constraints\.txt .*-e '\.\[test,dev\]' -e \./tools", ci)


def test_dockerignore_keeps_out_history_and_venvs_but_nothing_the_image_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        parts = Path(path).parts
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        return any(fnmatch.fnmatch(p, pat) for p in prefixes for pat in patterns)

    assert ignored(".git/HEAD") and ignored(".venv/bin/python")
    assert ignored("epp/__pycache__/cli.cpython-311.pyc")
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    copied = [
        src
        for line in re.findall(r"^COPY (?!--from)(.+)$", dockerfile, flags=re.M)
        for src in line.split()[:-1]
    ]
    for mount in re.findall(r"--mount=(\S+)", dockerfile):  # bind mounts of the build context
        options = dict(kv.split("=", 1) for kv in mount.split(","))
        if "from" not in options:
            copied.append(options["source"])
    assert "constraints.txt" in copied
    for src in copied:
        assert (ROOT / src).exists(), src
        assert not ignored(src), f"{src} is copied into the image but .dockerignore excludes it"


def test_no_two_installed_distributions_ship_the_same_file() -> None:
    """pip lets the wheel installed last overwrite a file another wheel holds: the EPP's
    dependencies must not overlap (an old copy of opentelemetry/proto shipped by a second wheel
    broke the OTLP exporter depending on install order). Checks this environment: a leftover
    package a dependency change dropped shows up too, with the command that removes it."""
    from importlib.metadata import distributions

    owner: dict[str, str] = {}
    clashes: dict[tuple[str, str], list[str]] = {}
    for dist in distributions():
        name = dist.metadata["Name"]
        for file in dist.files or ():
            path = str(file)
            if ".dist-info/" in path or "__pycache__" in path or path.startswith(".."):
                continue
            if owner.get(path, name) != name:
                clashes.setdefault((owner[path], name), []).append(path)
            owner[path] = name
    assert not clashes, "; ".join(
        f"{a} and {b} both ship {len(paths)} files ({paths[0]}, ...): "
        f"`pip uninstall` the one the project does not depend on"
        for (a, b), paths in clashes.items()
    )


def _wheel_files(project: Path, out: Path) -> list[str]:
    (wheel,) = WheelBuilder(str(project)).build(directory=str(out), versions=["standard"])
    return zipfile.ZipFile(wheel).namelist()


def test_the_service_wheel_holds_no_tool_module(tmp_path: Path) -> None:
    service = _wheel_files(ROOT, tmp_path / "service")
    assert "epp/cli.py" in service and "epp/envoyconfig/cli.py" in service
    assert not [f for f in service if f.startswith(TOOL_PATHS)]
    tools = _wheel_files(ROOT / "tools", tmp_path / "tools")
    assert "epp_tools/bench/cli.py" in tools and "epp_tools/sim/cli.py" in tools
    assert not [f for f in tools if f.endswith(".py") and not f.startswith("epp_tools/")]


def test_the_image_copies_no_tool() -> None:
    """The image installs the wheel built from what the Dockerfile copies: the service's
    packages, never ``tools/``."""
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    copied = [
        src
        for line in re.findall(r"^COPY (?!--from)(.+)$", dockerfile, flags=re.M)
        for src in line.split()[:-1]
    ]
    assert {"epp", "scorers", "filters"} <= set(copied)
    for src in copied:
        assert not src.startswith("tools"), src
        path = ROOT / src
        found = list(path.rglob("*.py")) if path.is_dir() else []
        assert not [p for p in found if str(p.relative_to(ROOT)).startswith(TOOL_PATHS)]
