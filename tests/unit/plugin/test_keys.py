"""Typed data keys: a key is its ``<type>/<producer>`` text, and reads back its value typed."""

from __future__ import annotations

from epp.plugin import (
    PREFIX_MATCH_INFO,
    TOKENIZED_PROMPT,
    DataKey,
    DataType,
    PrefixMatchInfo,
    TokenizedPrompt,
    data_key,
)
from epp.plugin.inflight import INFLIGHT_LOAD, InFlightLoad
from tests.builders import make_request


def test_key_is_interchangeable_with_its_text_when_used_as_attribute_key() -> None:
    key = TOKENIZED_PROMPT.key("token-producer")
    assert isinstance(key, DataKey)
    assert key == "TokenizedPrompt/token-producer"
    assert hash(key) == hash("TokenizedPrompt/token-producer")
    assert (key.data_type, key.producer) == ("TokenizedPrompt", "token-producer")
    prompt = TokenizedPrompt.from_token_ids([[1, 2, 3]])
    # A producer that spells the key as plain text is read by a typed consumer, and back.
    request = make_request(attributes={"TokenizedPrompt/token-producer": prompt})
    assert key.get(request) is prompt
    assert data_key("TokenizedPrompt", "token-producer") == key


def test_put_and_get_round_trip_when_producers_have_different_names() -> None:
    request = make_request()
    a, b = PREFIX_MATCH_INFO.key("a"), PREFIX_MATCH_INFO.key("b")
    a.put(request, {"ep": PrefixMatchInfo(1, 2, 16)})
    assert a.get(request) == {"ep": PrefixMatchInfo(1, 2, 16)}
    assert b.get(request) is None
    INFLIGHT_LOAD.key("x").put(request, {"ep": InFlightLoad(requests=2, tokens=10)})
    assert set(request.attributes) == {"PrefixCacheMatchInfo/a", "InFlightLoad/x"}


def test_data_type_is_its_name_when_compared_or_formatted() -> None:
    custom: DataType[int] = DataType("Custom")
    assert custom == "Custom"
    assert f"{custom}/p" == custom.key("p")


def test_key_survives_copy_and_pickle_when_attributes_are_copied() -> None:
    import copy
    import pickle

    key = TOKENIZED_PROMPT.key("tp")
    for clone in (copy.deepcopy(key), pickle.loads(pickle.dumps(key))):
        assert isinstance(clone, DataKey)
        assert (clone, clone.producer) == (key, "tp")
