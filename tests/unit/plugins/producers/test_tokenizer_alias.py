"""``tokenizer``: upstream's deprecated name of ``token-producer``, loaded from a config."""

from __future__ import annotations

import logging

import pytest

from epp.config.loader import load_config
from epp.plugin import TOKENIZED_PROMPT, DataProducer, RequestBody
from epp.plugin.registry import PluginRegistry
from epp.plugins.producers.tokens import Tokenizer, TokenProducer
from tests.builders import handle, make_endpoint, make_request

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: tokenizer
  parameters: {backend: estimate}
- type: prefix-cache-scorer
"""


async def test_a_config_naming_tokenizer_loads_a_token_producer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        pipeline = load_config(
            CONFIG, registry=PluginRegistry.from_entry_points(), handle_for=handle
        )
    alias = pipeline.instances["tokenizer"]
    assert isinstance(alias, Tokenizer) and isinstance(alias, TokenProducer)
    assert isinstance(alias, DataProducer)
    assert str(alias.typed_name) == "tokenizer/tokenizer"
    assert any(
        "'tokenizer' is deprecated; use 'token-producer'" in r.message for r in caplog.records
    )
    # it publishes under its own name; the prefix scorer's default key gets its own producer
    assert alias.produces() == {TOKENIZED_PROMPT.key("tokenizer")}
    assert "token-producer" in pipeline.instances

    request = make_request(
        body=RequestBody(kind="completions", payload={"prompt": "hello there"}, raw=b"")
    )
    await alias.produce(request, [make_endpoint(0)])
    await pipeline.instances["token-producer"].produce(request, [make_endpoint(0)])
    aliased = request.attributes[TOKENIZED_PROMPT.key("tokenizer")]
    assert aliased == request.attributes[TOKENIZED_PROMPT.key("token-producer")]
    assert aliased.token_count == 3  # 11 bytes, 4 per pseudo-token
