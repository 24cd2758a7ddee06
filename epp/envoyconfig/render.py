"""Typed messages → the YAML or JSON Envoy and Istio read (proto3 JSON, snake_case field names,
``Any`` expanded with its ``@type``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

import betterproto2
import yaml

Format = Literal["yaml", "json"]


def as_dict(message: betterproto2.Message) -> dict[str, Any]:
    return message.to_dict(casing=betterproto2.Casing.SNAKE)


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(document: Mapping[str, Any] | list[Any], fmt: Format = "yaml") -> str:
    """One document as text. YAML keeps field order and writes Lua sources as blocks."""
    if fmt == "json":
        return json.dumps(document, indent=2) + "\n"
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)


def dump_all(documents: list[Any], fmt: Format = "yaml") -> str:
    if fmt == "json":
        return json.dumps(documents if len(documents) != 1 else documents[0], indent=2) + "\n"
    return "---\n".join(dump(d, fmt) for d in documents)
