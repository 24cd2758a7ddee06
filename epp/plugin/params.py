"""Strict decoding of YAML ``parameters`` onto a plugin's frozen ``Params`` dataclass.

YAML keys are camelCase; each dataclass field ``foo_bar`` is read from ``fooBar`` unless the field
declares ``metadata={"yaml": "otherName"}``. Unknown keys, wrong types and values rejected by the
dataclass's ``__post_init__`` (raise ``ValueError``) fail with the field path; an unknown key is
answered with the closest known ones (``did you mean 'maxQueueDepth'?``), or the known keys when
none is close.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

from epp.plugin.errors import did_you_mean


class ParamError(Exception):
    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


def yaml_key(field: dataclasses.Field[Any]) -> str:
    explicit = field.metadata.get("yaml")
    if explicit:
        return str(explicit)
    head, *rest = field.name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def decode(cls: type[Any], data: Any, path: str = "") -> Any:
    """Build ``cls`` (a dataclass) from ``data`` (a mapping or None)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ParamError(path, f"expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {yaml_key(f): f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = str(unknown[0])
        hint = did_you_mean(key, fields)
        known = f"; {hint}" if hint else f" (known: {', '.join(sorted(fields)) or 'none'})"
        raise ParamError(_join(path, key), f"unknown field{known}")
    kwargs = {}
    for key, field in fields.items():
        if key in data:
            kwargs[field.name] = _convert(hints[field.name], data[key], _join(path, key))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ParamError(_join(path, key), "required field is missing")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ParamError(path, str(exc)) from None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        present = [arg for arg in args if arg is not type(None)]
        if len(present) == 1:  # an optional field: its own error, with its own path
            return _convert(present[0], value, path)
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path)
            except ParamError as exc:
                errors.append(exc.problem)
        raise ParamError(path, "; ".join(errors))
    if origin is Literal:
        if value not in get_args(tp):
            allowed = ", ".join(repr(a) for a in get_args(tp))
            raise ParamError(path, f"must be one of {allowed}, got {value!r}")
        return value
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if not isinstance(value, list):
            raise ParamError(path, f"expected a list, got {type(value).__name__}")
        args = get_args(tp)
        item = args[0] if args else Any
        return tuple(_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ParamError(path, f"expected a mapping, got {type(value).__name__}")
        args = get_args(tp)
        vt = args[1] if len(args) == 2 else Any
        return {str(k): _convert(vt, v, _join(path, str(k))) for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return decode(tp, value, path)
    return _scalar(tp, value, path)


def _scalar(tp: Any, value: Any, path: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ParamError(path, f"expected a boolean, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ParamError(path, f"expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ParamError(path, f"expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ParamError(path, f"expected a string, got {value!r}")
    raise ParamError(path, f"unsupported parameter type {tp!r}")
