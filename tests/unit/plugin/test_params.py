"""Strict decoding of YAML ``parameters`` (``epp.plugin.params``): the camelCase keys, the types a
value may have, and the exact error a config author sees, with the field's path."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from epp.plugin.params import ParamError, decode, yaml_key


@dataclass(frozen=True)
class Inner:
    block_size: int = 16
    name: str = "x"


@dataclass(frozen=True)
class Params:
    max_queue_depth: int = 128
    weight: float = 1.0
    enabled: bool = False
    mode: Literal["fast", "slow"] = "fast"
    tags: tuple[str, ...] = ()
    labels: dict[str, int] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)
    timeout: float | None = None
    legacy_name: str = field(default="", metadata={"yaml": "oldName"})
    derived: int = field(default=0, init=False)


@dataclass(frozen=True)
class Required:
    target: str
    count: int = 1


@dataclass(frozen=True)
class Checked:
    threshold: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.threshold <= 1:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")


@dataclass(frozen=True)
class Loose:
    anything: Any = None
    items: list = field(default_factory=list)  # type: ignore[type-arg]
    table: dict = field(default_factory=dict)  # type: ignore[type-arg]
    seq: Sequence[int] = ()
    mapping: Mapping[str, float] = field(default_factory=dict)
    either: int | str = 0
    pair: tuple[int, ...] = ()


@dataclass(frozen=True)
class Empty:
    pass


@dataclass(frozen=True)
class Odd:
    value: complex = 0j


def _error(cls: type, data: Any) -> ParamError:
    with pytest.raises(ParamError) as info:
        decode(cls, data)
    return info.value


def test_yaml_keys_are_camel_case_unless_named() -> None:
    by_name = {f.name: yaml_key(f) for f in dataclasses.fields(Params)}
    assert by_name["max_queue_depth"] == "maxQueueDepth"
    assert by_name["weight"] == "weight"
    assert by_name["legacy_name"] == "oldName"

    @dataclass
    class Short:
        a_b: int = 0
        kv_cache_x: int = 0

    assert [yaml_key(f) for f in dataclasses.fields(Short)] == ["aB", "kvCacheX"]


def test_none_and_empty_mapping_give_the_defaults() -> None:
    assert decode(Params, None) == Params()
    assert decode(Params, {}) == Params()


def test_every_field_decodes_from_its_camel_case_key() -> None:
    got = decode(
        Params,
        {
            "maxQueueDepth": 7,
            "weight": 2,
            "enabled": True,
            "mode": "slow",
            "tags": ["a", "b"],
            "labels": {"x": 1, 2: 3},
            "inner": {"blockSize": 64, "name": "n"},
            "timeout": 1.5,
            "oldName": "legacy",
        },
    )
    assert got == Params(
        max_queue_depth=7,
        weight=2.0,
        enabled=True,
        mode="slow",
        tags=("a", "b"),
        labels={"x": 1, "2": 3},
        inner=Inner(block_size=64, name="n"),
        timeout=1.5,
        legacy_name="legacy",
    )
    assert type(got.weight) is float
    assert type(got.tags) is tuple


def test_snake_case_and_init_false_keys_are_unknown() -> None:
    err = _error(Params, {"max_queue_depth": 3})
    assert err.path == "max_queue_depth"
    assert str(err) == "max_queue_depth: unknown field; did you mean 'maxQueueDepth'?"
    assert _error(Params, {"derived": 1}).path == "derived"
    assert _error(Params, {"legacyName": "x"}).path == "legacyName"


def test_an_unknown_key_names_the_closest_known_ones_or_all_when_none_is_close() -> None:
    assert str(_error(Params, {"wieght": 1})) == "wieght: unknown field; did you mean 'weight'?"
    assert str(_error(Params, {"timout": 1})) == "timout: unknown field; did you mean 'timeout'?"
    assert str(_error(Params, {"zzz": 1})) == (
        "zzz: unknown field (known: enabled, inner, labels, maxQueueDepth, mode, oldName, tags, "
        "timeout, weight)"
    )


def test_the_first_unknown_key_in_sorted_order_is_named() -> None:
    assert _error(Params, {"zeta": 1, "alpha": 2, "weight": 1}).path == "alpha"


def test_a_dataclass_without_fields_knows_none() -> None:
    assert str(_error(Empty, {"x": 1})) == "x: unknown field (known: none)"


def test_a_non_mapping_is_refused_with_its_type() -> None:
    err = _error(Params, [1, 2])
    assert str(err) == "expected a mapping, got list"
    assert err.path == ""
    assert err.problem == "expected a mapping, got list"
    assert str(_error(Params, {"inner": "big"})) == "inner: expected a mapping, got str"


def test_a_missing_required_field_is_named() -> None:
    assert str(_error(Required, {"count": 2})) == "target: required field is missing"
    assert decode(Required, {"target": "t"}) == Required(target="t")


def test_post_init_value_errors_carry_the_path_of_the_object() -> None:
    assert str(_error(Checked, {"threshold": 2})) == "threshold must be in [0, 1], got 2.0"

    @dataclass(frozen=True)
    class Outer:
        checked: Checked = field(default_factory=Checked)

    err = _error(Outer, {"checked": {"threshold": -1}})
    assert err.path == "checked"
    assert err.problem == "threshold must be in [0, 1], got -1.0"


def test_nested_paths_name_the_exact_field() -> None:
    err = _error(Params, {"inner": {"blockSize": "big"}})
    assert str(err) == "inner.blockSize: expected an integer, got 'big'"
    err = _error(Params, {"inner": {"nope": 1}})
    assert str(err) == "inner.nope: unknown field (known: blockSize, name)"
    assert str(_error(Params, {"tags": ["a", 3]})) == "tags[1]: expected a string, got 3"
    assert str(_error(Params, {"labels": {"k": "v"}})) == "labels.k: expected an integer, got 'v'"


def test_booleans_are_strict() -> None:
    assert decode(Params, {"enabled": False}).enabled is False
    assert str(_error(Params, {"enabled": "true"})) == "enabled: expected a boolean, got 'true'"
    assert str(_error(Params, {"enabled": 1})) == "enabled: expected a boolean, got 1"


def test_integers_take_whole_floats_and_refuse_booleans() -> None:
    got = decode(Params, {"maxQueueDepth": 3.0}).max_queue_depth
    assert got == 3 and type(got) is int
    assert str(_error(Params, {"maxQueueDepth": 3.5})) == (
        "maxQueueDepth: expected an integer, got 3.5"
    )
    assert str(_error(Params, {"maxQueueDepth": True})) == (
        "maxQueueDepth: expected an integer, got True"
    )
    assert str(_error(Params, {"maxQueueDepth": "3"})) == (
        "maxQueueDepth: expected an integer, got '3'"
    )


def test_numbers_take_integers_and_refuse_booleans_and_strings() -> None:
    assert decode(Params, {"weight": 0.25}).weight == 0.25
    assert str(_error(Params, {"weight": False})) == "weight: expected a number, got False"
    assert str(_error(Params, {"weight": "1"})) == "weight: expected a number, got '1'"


def test_strings_are_strict() -> None:
    assert str(_error(Inner, {"name": 5})) == "name: expected a string, got 5"


def test_literals_list_what_is_allowed() -> None:
    assert str(_error(Params, {"mode": "medium"})) == (
        "mode: must be one of 'fast', 'slow', got 'medium'"
    )


def test_lists_must_be_lists() -> None:
    assert str(_error(Params, {"tags": "a,b"})) == "tags: expected a list, got str"
    assert str(_error(Params, {"tags": ("a",)})) == "tags: expected a list, got tuple"


def test_maps_must_be_mappings() -> None:
    assert str(_error(Params, {"labels": ["a"]})) == "labels: expected a mapping, got list"
    assert str(_error(Loose, {"mapping": 3})) == "mapping: expected a mapping, got int"


def test_optional_fields_take_null_and_a_value() -> None:
    assert decode(Params, {"timeout": None}).timeout is None
    assert decode(Params, {"timeout": 2}).timeout == 2.0
    assert str(_error(Params, {"timeout": "soon"})) == "timeout: expected a number, got 'soon'"


def test_unions_try_each_type_and_report_every_problem() -> None:
    assert decode(Loose, {"either": 4}).either == 4
    assert decode(Loose, {"either": "four"}).either == "four"
    assert str(_error(Loose, {"either": 1.5})) == (
        "either: expected an integer, got 1.5; expected a string, got 1.5"
    )
    assert str(_error(Loose, {"either": None})) == (
        "either: expected an integer, got None; expected a string, got None"
    )


def test_untyped_and_abstract_containers() -> None:
    got = decode(
        Loose,
        {
            "anything": {"x": [1]},
            "items": [1, "a"],
            "table": {1: "a"},
            "seq": [1, 2.0],
            "mapping": {"a": 1},
            "pair": [1, 2, 3],
        },
    )
    assert got.anything == {"x": [1]}
    assert got.items == (1, "a")
    assert got.table == {"1": "a"}
    assert got.seq == (1, 2) and type(got.seq[1]) is int
    assert got.mapping == {"a": 1.0} and type(got.mapping["a"]) is float
    assert got.pair == (1, 2, 3)
    assert str(_error(Loose, {"seq": [1, "x"]})) == "seq[1]: expected an integer, got 'x'"
    assert str(_error(Loose, {"pair": [True]})) == "pair[0]: expected an integer, got True"
    assert str(_error(Loose, {"items": {"a": 1}})) == "items: expected a list, got dict"
    assert str(_error(Loose, {"table": [1]})) == "table: expected a mapping, got list"


def test_an_unsupported_type_is_reported() -> None:
    assert str(_error(Odd, {"value": 1})) == "value: unsupported parameter type <class 'complex'>"


def test_param_error_without_a_path_is_the_problem_alone() -> None:
    err = ParamError("", "bad")
    assert str(err) == "bad" and err.path == "" and err.problem == "bad"
    err = ParamError("a.b", "bad")
    assert str(err) == "a.b: bad" and err.path == "a.b" and err.problem == "bad"


def test_type_errors_from_the_constructor_are_param_errors() -> None:
    @dataclass(frozen=True)
    class Strict:
        n: int = 0

        def __post_init__(self) -> None:
            if self.n < 0:
                raise TypeError("n must not be negative")

    err = _error(Strict, {"n": -1})
    assert str(err) == "n must not be negative" and err.path == ""


@dataclass(frozen=True)
class NoneFirst:
    limit: None | int = None  # noqa: RUF036 (a plugin author may write it so)


def test_a_union_naming_null_first_still_takes_its_other_types() -> None:
    assert decode(NoneFirst, {"limit": 3}).limit == 3
    assert decode(NoneFirst, {"limit": None}).limit is None
    assert str(_error(NoneFirst, {"limit": "x"})) == "limit: expected an integer, got 'x'"


def test_a_missing_nested_field_is_named_with_its_path() -> None:
    @dataclass(frozen=True)
    class Outer:
        req: Required = field(default_factory=lambda: Required(target="t"))

    assert str(_error(Outer, {"req": {"count": 2}})) == "req.target: required field is missing"
