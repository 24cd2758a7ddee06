"""Typed data keys: how producers and consumers name what they exchange on a request.

A producer publishes values in ``InferenceRequest.attributes`` under a ``DataKey``: the string
``<data type>/<producer name>``, so one type can be configured several times under different
names. ``DataType[T]`` names a kind of value; ``DataType.key(producer)`` gives the ``DataKey[T]``
a producer of that name publishes at, and ``key.get(request)`` reads it back typed::

    TOKENIZED_PROMPT: Final[DataType[TokenizedPrompt]] = DataType("TokenizedPrompt")
    key = TOKENIZED_PROMPT.key("token-producer")      # DataKey[TokenizedPrompt]
    prompt = key.get(request)                          # TokenizedPrompt | None

Both are ``str`` subclasses: a key hashes and compares like its text (attribute lookups stay
plain dict probes), and a plugin that spells a key as a plain string still interoperates.
``DataProducer.produces()`` and ``Consumer.consumes()`` return sets of keys; the loader uses them
to order producers and to create the default producer of a consumed key nobody produces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

if TYPE_CHECKING:
    from epp.plugin.types import InferenceRequest

T = TypeVar("T")


class DataKey(str, Generic[T]):
    """``<data type>/<producer name>``: where one producer's value of type ``T`` lives."""

    __slots__ = ()

    def __new__(cls, data_type: str, producer: str) -> DataKey[T]:
        return super().__new__(cls, f"{data_type}/{producer}")

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]  # rebuilt from its parts
        return self.data_type, self.producer

    @property
    def data_type(self) -> str:
        return self.partition("/")[0]

    @property
    def producer(self) -> str:
        return self.partition("/")[2]

    def get(self, request: InferenceRequest) -> T | None:
        """The value published on ``request`` under this key, if any."""
        return cast("T | None", request.attributes.get(self))

    def put(self, request: InferenceRequest, value: T) -> None:
        request.attributes[self] = value


class DataType(str, Generic[T]):
    """The name of a kind of value producers publish (``PrefixCacheMatchInfo``, ...)."""

    __slots__ = ()

    def key(self, producer: str) -> DataKey[T]:
        """The key a producer named ``producer`` publishes this type at."""
        return DataKey(self, producer)


def data_key(data_type: str, producer_name: str) -> DataKey[Any]:
    """The (untyped) key a producer named ``producer_name`` publishes ``data_type`` at."""
    return DataKey(data_type, producer_name)
