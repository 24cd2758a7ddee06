"""The house rules that keep the layout legible (docs/architecture.md): where each plugin lives, no
import cycles, no package using another's private names, and functions of a readable size (modules
are split by cohesion, not by a line count), in the service and the tools alike. The import
contracts themselves are checked by ``lint-imports`` (``[tool.importlinter]`` in
pyproject.toml)."""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"epp": ROOT, "scorers": ROOT, "filters": ROOT, "epp_tools": ROOT / "tools"}
"""Each root package of the repository and the folder it sits in (the tools are a distribution
of their own, ``tools/``)."""
MAX_FUNCTION_LINES = 60


def _entry_points() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project["entry-points"]["epp.plugins"])


def test_every_builtin_plugin_lives_where_its_type_name_says() -> None:
    misplaced = []
    for type_name, target in _entry_points().items():
        module = target.partition(":")[0]
        if type_name.endswith("-scorer"):
            home = "scorers."
        elif type_name.endswith("-filter"):
            home = "filters."
        else:
            home = "epp.plugins."
        if not module.startswith(home):
            misplaced.append(f"{type_name} -> {target} (expected under {home})")
    assert not misplaced, "\n".join(misplaced)
    assert len(_entry_points()) >= 40  # the check above ran over the real table


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_module_imports_in_a_cycle() -> None:
    # Every import counts, including ones inside functions and under TYPE_CHECKING.
    for folder in sorted({str(f) for f in PACKAGES.values()}):
        sys.path.insert(0, folder)
    built = grimp.build_graph(*PACKAGES, include_external_packages=False)
    graph = {m: set(built.find_modules_directly_imported_by(m)) for m in built.modules}
    assert len(graph) > 150  # the whole tree was read
    assert any(m.startswith("epp_tools.bench.") for m in graph)  # the tools too
    assert _cycles(graph) == []


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _sources() -> list[Path]:
    return sorted(
        p
        for package, folder in PACKAGES.items()
        for p in (folder / package).rglob("*.py")
        if "_proto" not in p.parts
    )


def test_functions_stay_small() -> None:
    too_big = []
    for path in _sources():
        text = path.read_text()
        rel = path.relative_to(ROOT)
        for fn in _functions(ast.parse(text)):
            assert fn.end_lineno is not None
            length = fn.end_lineno - fn.lineno + 1
            if length > MAX_FUNCTION_LINES:
                too_big.append(f"{rel}:{fn.lineno} {fn.name}(): {length} lines")
    assert not too_big, "\n".join(too_big)


def _package(path: Path) -> str:
    """The package a source file belongs to (a package's ``__init__`` belongs to itself)."""
    for package, folder in PACKAGES.items():
        if path.is_relative_to(folder / package):
            return ".".join(path.parent.relative_to(folder).parts)
    raise ValueError(path)


def _package_of_module(module: str) -> str:
    for package, folder in PACKAGES.items():
        if module.split(".")[0] == package:
            is_package = (folder / module.replace(".", "/")).is_dir()
            return module if is_package else module.rpartition(".")[0]
    return ""


def _private_uses(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, ``module._name``) of each private name of a project module this tree imports
    (``from m import _name``) or reads from an imported module (``m._name``)."""
    modules: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    yield node.lineno, f"{node.module}.{alias.name}"
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            yield node.lineno, f"{modules[node.value.id]}.{node.attr}"


def test_no_package_uses_another_packages_private_names() -> None:
    """A leading underscore is private to its package: what another package needs is public
    where it belongs (the benchmarks' subpackages included)."""
    crossing = []
    for path in _sources():
        here = _package(path)
        for line, used in _private_uses(ast.parse(path.read_text())):
            owner = _package_of_module(used.rpartition(".")[0])
            if owner and owner != here:
                crossing.append(f"{path.relative_to(ROOT)}:{line} uses {used}")
    assert not crossing, "\n".join(crossing)
