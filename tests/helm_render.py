"""A minimal renderer of the Go-template subset the chart in ``deploy/helm/`` uses, so the test
suite checks the chart where ``helm`` is not installed (where it is, the tests compare the two).

Supported: ``{{ }}`` actions with ``{{-`` / ``-}}`` trimming and ``{{/* */}}`` comments; ``define``,
``if`` / ``else if`` / ``else``, ``range`` (over a list, or a map in key order, with optional
``$k, $v :=``), ``$x :=``; fields of ``.``, ``$`` and variables; parenthesised pipelines; the
functions ``include``, ``toYaml``, ``indent``, ``nindent``, ``default``, ``quote``, ``printf``,
``trunc``, ``trimSuffix``, ``required``, ``fail``, ``and``, ``or``, ``not``, ``eq``, ``ne``,
``kindIs``, ``sha256sum``. It is stricter than helm on purpose: reading a key that the values do
not define is an error (helm renders nothing), so a typo in a template or a key missing from
``values.yaml`` fails the tests. Anything outside the subset raises ``TemplateError``.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Chart", "TemplateError", "merge_values"]


class TemplateError(Exception):
    """The template is outside the subset, or rendering failed (``fail``, ``required``)."""


# ---- lexing -------------------------------------------------------------------------------------


def _action_end(text: str, start: int) -> int:
    """Index of the ``}}`` closing the action whose body starts at ``start`` (quotes respected)."""
    i, quote = start, ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c in '"`':
            quote = c
        elif text.startswith("}}", i):
            return i
        i += 1
    raise TemplateError(f"unclosed action at {start}")


def _lex(text: str) -> list[tuple[str, str]]:
    """``("text", s)`` and ``("action", body)`` tokens, with the trim markers applied."""
    tokens: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    while True:
        start = text.find("{{", pos)
        chunk = text[pos:] if start < 0 else text[pos:start]
        if trim_next:
            chunk = chunk.lstrip()
        if start < 0:
            tokens.append(("text", chunk))
            return tokens
        end = _action_end(text, start + 2)
        body = text[start + 2 : end]
        if body.startswith("- "):
            chunk, body = chunk.rstrip(), body[2:]
        trim_next = body.endswith(" -")
        if trim_next:
            body = body[:-2]
        tokens.append(("text", chunk))
        body = body.strip()
        if not (body.startswith("/*") and body.endswith("*/")):
            tokens.append(("action", body))
        pos = end + 2


# ---- parsing ------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|`[^`]*`)|(?P<num>-?\d+(?:\.\d+)?)|(?P<punct>[()|,])'
    r"|(?P<assign>:=)|(?P<word>[$.A-Za-z_][$.\w]*))"
)


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr.rstrip()):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise TemplateError(f"cannot parse {expr[pos:]!r} in {{{{ {expr} }}}}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


@dataclass
class _Node:
    kind: str  # text, expr, assign, if, range
    text: str = ""
    pipe: list[Any] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    branches: list[tuple[list[Any] | None, list[_Node]]] = field(default_factory=list)


def _parse_pipe(toks: list[tuple[str, str]], i: int = 0) -> tuple[list[Any], int]:
    """A pipeline: commands separated by ``|``; each command a list of operands."""
    commands: list[list[Any]] = [[]]
    while i < len(toks):
        kind, value = toks[i]
        if value == ")":
            return commands, i
        if value == "|":
            commands.append([])
        elif value == "(":
            sub, i = _parse_pipe(toks, i + 1)
            commands[-1].append(("pipe", sub))
        else:
            commands[-1].append((kind, value))
        i += 1
    return commands, i


def _compile(body: str) -> list[Any]:
    pipe, end = _parse_pipe(_tokens(body))
    if end != len(_tokens(body)) or not all(pipe):
        raise TemplateError(f"unbalanced pipeline {{{{ {body} }}}}")
    return pipe


def _parse(tokens: list[tuple[str, str]], defines: dict[str, list[_Node]]) -> list[_Node]:
    root: list[_Node] = []
    stack: list[tuple[_Node | None, list[_Node]]] = [(None, root)]
    for kind, body in tokens:
        out = stack[-1][1]
        word = body.split(" ", 1)[0]
        rest = body[len(word) :].strip()
        if kind == "text":
            out.append(_Node("text", text=body))
        elif word == "define":
            node = _Node("define", text=ast.literal_eval(rest), branches=[(None, [])])
            stack.append((node, node.branches[0][1]))
        elif word in ("if", "range"):
            node = _Node(word)
            if word == "range" and ":=" in rest:
                names, rest = rest.split(":=", 1)
                node.names = [n.strip() for n in names.split(",")]
            node.branches.append((_compile(rest), []))
            out.append(node)
            stack.append((node, node.branches[-1][1]))
        elif word == "else":
            node = stack.pop()[0]
            assert node is not None and node.kind == "if", f"else outside if: {body}"
            cond = _compile(rest[2:].strip()) if rest.startswith("if") else None
            node.branches.append((cond, []))
            stack.append((node, node.branches[-1][1]))
        elif word == "end":
            node = stack.pop()[0]
            if node is not None and node.kind == "define":
                defines[node.text] = node.branches[0][1]
        elif word.startswith("$") and rest.startswith(":="):
            out.append(_Node("assign", names=[word], pipe=_compile(rest[2:])))
        else:
            out.append(_Node("expr", pipe=_compile(body)))
    if len(stack) != 1:
        raise TemplateError("missing {{ end }}")
    return root


# ---- evaluation ---------------------------------------------------------------------------------


def _truthy(value: Any) -> bool:
    return value not in (None, False, 0, "") and not (
        isinstance(value, Mapping | list) and not value
    )


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, Mapping | list):
        raise TemplateError(f"printing a {type(value).__name__}: pipe it through toYaml")
    return str(value)


def _to_yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n")


def _indent(n: int, text: str) -> str:
    return "\n".join(" " * n + line for line in str(text).split("\n"))


def _kind(value: Any) -> str:
    for python, go in ((bool, "bool"), (str, "string"), (int, "int"), (float, "float64")):
        if isinstance(value, python):
            return go
    return "map" if isinstance(value, Mapping) else "slice" if isinstance(value, list) else "?"


def _required(message: str, value: Any) -> Any:
    if not _truthy(value):
        raise TemplateError(message)
    return value


def _fail(message: str) -> str:
    raise TemplateError(message)


def _and(*args: Any) -> Any:
    for a in args:
        if not _truthy(a):
            return a
    return args[-1]


def _or(*args: Any) -> Any:
    for a in args:
        if _truthy(a):
            return a
    return args[-1]


_FUNCS: dict[str, Callable[..., Any]] = {
    "toYaml": _to_yaml,
    "indent": _indent,
    "nindent": lambda n, text: "\n" + _indent(n, text),
    "default": lambda fallback, value=None: value if _truthy(value) else fallback,
    "quote": lambda value: '"' + _text(value).replace("\\", "\\\\").replace('"', '\\"') + '"',
    "printf": lambda fmt, *args: fmt.replace("%v", "%s") % tuple(_text(a) for a in args),
    "trunc": lambda n, text: text[:n],
    "trimSuffix": lambda suffix, text: text[: -len(suffix)] if text.endswith(suffix) else text,
    "required": _required,
    "fail": _fail,
    "and": _and,
    "or": _or,
    "not": lambda value: not _truthy(value),
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "kindIs": lambda kind, value: _kind(value) == kind,
    "sha256sum": lambda text: hashlib.sha256(text.encode()).hexdigest(),
}


class _Scope:
    def __init__(self, chart: Chart, dot: Any, variables: dict[str, Any]) -> None:
        self.chart, self.dot, self.vars = chart, dot, variables

    def field(self, path: str) -> Any:
        if path.startswith("$"):
            name, _, rest = path.partition(".")
            if name not in self.vars:
                raise TemplateError(f"undefined variable {name}")
            value, parts = self.vars[name], rest.split(".") if rest else []
        else:
            value, parts = self.dot, path.split(".")[1:] if path != "." else []
        for part in parts:
            if not isinstance(value, Mapping) or part not in value:
                raise TemplateError(f"{path}: no key {part!r} (add it to values.yaml)")
            value = value[part]
        return value

    def operand(self, op: tuple[str, Any]) -> Any:
        kind, value = op
        if kind == "pipe":
            return self.pipe(value)
        if kind == "str":
            return value[1:-1] if value.startswith("`") else ast.literal_eval(value)
        if kind == "num":
            return float(value) if "." in value else int(value)
        if value in ("true", "false", "nil"):
            return {"true": True, "false": False, "nil": None}[value]
        if value.startswith((".", "$")):
            return self.field(value)
        raise TemplateError(f"{value} is not a value")

    def command(self, cmd: list[tuple[str, Any]], piped: tuple[Any, ...]) -> Any:
        kind, head = cmd[0]
        if kind != "word" or head.startswith((".", "$")) or head in ("true", "false", "nil"):
            if len(cmd) != 1 or piped:
                raise TemplateError(f"{head} is not a function")
            return self.operand(cmd[0])
        args = [self.operand(op) for op in cmd[1:]] + list(piped)
        if head == "include":
            name, data = args
            return self.chart.render_define(name, data)
        if head not in _FUNCS:
            raise TemplateError(f"function {head} is outside the supported subset")
        return _FUNCS[head](*args)

    def pipe(self, commands: list[list[tuple[str, Any]]]) -> Any:
        value: tuple[Any, ...] = ()
        for cmd in commands:
            value = (self.command(cmd, value),)
        return value[0]

    def run(self, nodes: list[_Node], out: list[str]) -> None:
        for node in nodes:
            if node.kind == "text":
                out.append(node.text)
            elif node.kind == "expr":
                out.append(_text(self.pipe(node.pipe)))
            elif node.kind == "assign":
                self.vars[node.names[0]] = self.pipe(node.pipe)
            elif node.kind == "if":
                for cond, body in node.branches:
                    if cond is None or _truthy(self.pipe(cond)):
                        _Scope(self.chart, self.dot, dict(self.vars)).run(body, out)
                        break
            elif node.kind == "range":
                self._range(node, out)

    def _range(self, node: _Node, out: list[str]) -> None:
        (cond, body), *_ = node.branches
        items = self.pipe(cond)
        pairs = sorted(items.items()) if isinstance(items, Mapping) else enumerate(items or [])
        for key, value in pairs:
            variables = dict(self.vars)
            if len(node.names) == 2:
                variables[node.names[0]], variables[node.names[1]] = key, value
            elif node.names:
                variables[node.names[0]] = value
            _Scope(self.chart, value, variables).run(body, out)


# ---- the chart ----------------------------------------------------------------------------------


def merge_values(base: Any, override: Any) -> Any:
    """Helm's coalescing of a values file over the chart's: maps merge, anything else replaces."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = merge_values(base.get(key), value) if key in base else value
        return merged
    return copy.deepcopy(override)


class Chart:
    """A chart directory: ``render(values_overrides)`` → {template file name: rendered text}."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.meta = yaml.safe_load((path / "Chart.yaml").read_text())
        self.values = yaml.safe_load((path / "values.yaml").read_text())
        self.defines: dict[str, list[_Node]] = {}
        self.templates: dict[str, list[_Node]] = {}
        for file in sorted((path / "templates").iterdir()):
            nodes = _parse(_lex(file.read_text()), self.defines)
            if not file.name.startswith("_") and file.suffix in (".yaml", ".yml"):
                self.templates[file.name] = nodes
        self._root: dict[str, Any] = {}

    def render_define(self, name: str, data: Any) -> str:
        if name not in self.defines:
            raise TemplateError(f"include of undefined template {name!r}")
        out: list[str] = []
        _Scope(self, data, {"$": data}).run(self.defines[name], out)
        return "".join(out)

    def render(
        self, overrides: Mapping[str, Any] | None = None, *, release: str = "epp",
        namespace: str = "default",
    ) -> dict[str, str]:  # fmt: skip
        values = merge_values(self.values, dict(overrides or {}))
        root = {
            "Values": values,
            "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
            "Chart": {
                "Name": self.meta["name"],
                "Version": self.meta["version"],
                "AppVersion": self.meta["appVersion"],
            },
        }
        rendered = {}
        for name, nodes in self.templates.items():
            out: list[str] = []
            _Scope(self, root, {"$": root}).run(nodes, out)
            rendered[name] = "".join(out)
        return rendered
