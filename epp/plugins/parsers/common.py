"""Helpers shared by the request parsers: one-shot JSON decoding, field type checks, output-token
caps and token-id arrays (path-suffix tables are ``epp.plugin.paths``).

Every request error is an ``InferenceError`` with code ``BAD_REQUEST`` (HTTP 400); the message
names the API and the offending field so a client can fix its request.
"""

from __future__ import annotations

import array
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, cast

import orjson

from epp.plugin import ErrorCode, Handle, InferenceError, NoParams, PluginBase

MAX_UINT32 = 0xFFFFFFFF
_INT_ONLY = frozenset({int})
# The array type code whose items are exactly 32 bits wide ("I" on every mainstream platform).
_UINT32_CODE = next(code for code in "IL" if array.array(code).itemsize == 4)


class ParserBase(PluginBase):
    """Base of the built-in parsers. Parsers need nothing from the framework handle, so it may be
    ``None`` (tests and tools build parsers without an application around them)."""

    Params: ClassVar[type[Any]] = NoParams

    def __init__(self, *, name: str, params: Any, handle: Handle | None) -> None:
        # PluginBase types the handle as required; parsers never dereference it.
        super().__init__(name=name, params=params, handle=cast(Handle, handle))


def bad_request(message: str) -> InferenceError:
    return InferenceError(ErrorCode.BAD_REQUEST, message)


def decode_object(body: bytes) -> dict[str, Any]:
    """Decode ``body`` (the single JSON parse of the request) and require a JSON object."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"error unmarshaling request bodyMap: {exc}") from None
    if not isinstance(payload, dict):
        raise bad_request(
            "error unmarshaling request bodyMap: request body must be a JSON object, "
            f"got {json_type(payload)}"
        )
    return payload


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def is_int(value: Any) -> bool:
    """A JSON integer: an int that is not a bool, or an integral float (``1e3``)."""
    if type(value) is int:
        return True
    return type(value) is float and value.is_integer()


# A field check: predicate over the decoded value plus the phrase used in the error message.
FieldCheck = tuple[Callable[[Any], bool], str]

STRING: FieldCheck = (lambda v: isinstance(v, str), "a string")
BOOLEAN: FieldCheck = (lambda v: isinstance(v, bool), "a boolean")
INTEGER: FieldCheck = (is_int, "an integer")
ARRAY: FieldCheck = (lambda v: isinstance(v, list), "an array")
OBJECT: FieldCheck = (lambda v: isinstance(v, dict), "an object")


def check_fields(obj: Mapping[str, Any], checks: Mapping[str, FieldCheck], where: str) -> None:
    """Reject present, non-null fields of the wrong JSON type (null means absent, as upstream)."""
    for key, (ok, expected) in checks.items():
        value = obj.get(key)
        if value is not None and not ok(value):
            raise bad_request(f"{where}{key} must be {expected}, got {json_type(value)}")


def check_objects(items: Iterable[Any], checks: Mapping[str, FieldCheck], where: str) -> None:
    """Each item must be a JSON object whose listed fields have the right type."""
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_request(f"{where}[{i}] must be an object, got {json_type(item)}")
        check_fields(item, checks, f"{where}[{i}].")


def max_output_tokens(payload: Mapping[str, Any], *keys: str) -> int | None:
    """The first key holding a non-negative whole number wins; a present but malformed value is
    skipped like an absent one (upstream treats it as "no cap" rather than an error)."""
    for key in keys:
        value = payload.get(key)
        if type(value) is int:
            if value >= 0:
                return value
        elif type(value) is float and value >= 0 and value.is_integer():
            return int(value)
    return None


def cache_salt(payload: Mapping[str, Any]) -> str:
    salt = payload.get("cache_salt")
    return salt if isinstance(salt, str) else ""


def token_ids(values: list[Any], where: str) -> tuple[int, ...]:
    """Validate a JSON array of uint32 token ids and return them as a tuple."""
    if set(map(type, values)) == _INT_ONLY:
        # Fast path: C-level passes for the type check and (via a uint32 array) the range check;
        # long prompts make this several times cheaper than a Python loop.
        try:
            array.array(_UINT32_CODE, values)
        except OverflowError:
            raise bad_request(f"{where} must hold unsigned 32-bit integers") from None
        return tuple(values)
    out = []
    for i, v in enumerate(values):
        if not is_int(v) or not 0 <= v <= MAX_UINT32:
            raise bad_request(f"{where}[{i}] must be an unsigned 32-bit integer, got {v!r}")
        out.append(int(v))
    return tuple(out)


def text_or_tokens(value: Any, where: str) -> tuple[bool, tuple[int, ...] | None]:
    """Validate an OpenAI prompt/input: a string, an array of strings or an array of token ids.

    Returns ``(non_empty, token_ids)``; ``token_ids`` is set only for a token-id array.
    """
    if isinstance(value, str):
        return value != "", None
    if isinstance(value, list):
        if not value:
            return False, None
        if isinstance(value[0], str):
            if not all(isinstance(v, str) for v in value):
                raise bad_request(f"{where}: mixed types in array")
            return True, None
        if is_int(value[0]):
            return True, token_ids(value, where)
        raise bad_request(f"{where}: unsupported array element type {json_type(value[0])}")
    if value is None:
        return False, None
    raise bad_request(f"{where} must be a string or an array, got {json_type(value)}")
