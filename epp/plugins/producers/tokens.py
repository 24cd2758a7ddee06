"""``token-producer``: the request's prompt as token ids, for prefix hashing and token counts.

Publishes a ``TokenizedPrompt`` in ``request.attributes["TokenizedPrompt/<name>"]`` before
scheduling. Requests with nothing to tokenize (raw bodies, ``count_tokens``, image generation)
get no attribute.

Backend ``estimate`` (the default; spec §4.5) uses no tokenizer: the prompt's text is serialised
to bytes and every 4 bytes form one little-endian ``uint32`` pseudo-token (the last one
zero-padded). The ids never match real engine tokens, but equal text gives equal ids, which is all
approximate prefix matching needs. What is serialised, per API:

- chat: compact JSON of ``tools`` (if any), then per message its ``role`` and its content (the
  string, or each ``text`` block; media blocks become placeholders, below).
- completions: ``prompt``; an array of several strings gives one prompt per string.
- embeddings: JSON of ``input``; conversations: JSON of ``items``.
- responses: JSON of ``[{"instructions": ...}, {"tools": ...}, {"input": ...}]`` (the first two
  only when present).
- anthropic messages: JSON of ``tools``, the ``system`` text (billing-header blocks skipped),
  then per message its ``role`` and content (``text``, ``thinking``, ``tool_use`` id + name +
  JSON input, ``tool_result`` text; images become placeholders).
- token ids (vLLM generate, completions or embeddings given as ids) pass through unchanged.

A media item (``image_url``, ``video_url``, ``input_audio``, ``audio_url``, Anthropic ``image``)
starts on a token boundary and becomes N copies of one pseudo-token, the low 32 bits of
xxh64(its URL or data), so the same asset matches and different assets do not. N estimates its
size in tokens as upstream does (``epp.plugins.producers.media_estimate``: by default 225 for an
image of unknown size, width x height / 1024 for a base64 PNG, GIF or JPEG, 4500 for a video,
``14 + 12.5 * seconds`` for audio), tuned by the ``estimate`` parameter and, for videos, by the
request's ``x-llm-d-video-duration-seconds``, ``x-llm-d-video-resolution`` and
``x-llm-d-video-fps`` headers.

The simulator (``epp_tools.sim``) tokenizes with the same 4-bytes-per-token rule, so against it the
estimate is exact for completions (chat differs: the simulator renders a chat template).

Backend ``vllm`` asks a vLLM server for the engine's real token ids
(``epp.plugins.producers.render``: ``/v1/completions/render`` and
``/v1/chat/completions/render``, with ``model`` set to ``modelName``), which precise prefix
matching needs. Other APIs, and any render failure (connection, timeout, non-200, bad answer),
fall back to the estimate; failures are logged at debug level and counted in
``llm_d_epp_token_producer_fallbacks_total{plugin_name, reason}``. The director bounds every
producer with its own timeout (0.4 s), which a slower render also hits.

Parameters (upstream's, plus ``backend``):

- ``modelName`` (string, default ""): the model the render asks for. Setting it, or ``vllm``,
  selects the ``vllm`` backend, as upstream.
- ``vllm``: ``url`` (default ``http://localhost:8000``), ``timeout`` (``5s``), ``mmTimeout``
  (``30s``, for requests with media).
- ``estimate``: the media estimates of the ``estimate`` backend (``image``, ``video``: see
  ``media_estimate``). Upstream refuses it beside ``vllm`` or ``modelName``; so does this EPP,
  unless ``backend: vllm`` says the estimate is the fallback it tunes.
- ``backend`` (``estimate`` | ``vllm``; this EPP's, optional): names the backend outright. When
  unset it follows from the parameters above (``estimate`` when none is set).

``tokenizer`` is upstream's deprecated name of this type (deprecated in v0.9.0): the same
producer with the same parameters, publishing under its own instance name
(``TokenizedPrompt/tokenizer`` when unnamed, so consumers of the default key still get an
auto-created ``token-producer``, as upstream); it logs its deprecation at start-up.

YAML::

    plugins:
      - type: token-producer
        parameters:
          backend: vllm
          modelName: meta-llama/Llama-3.1-8B-Instruct
          vllm: {url: "http://127.0.0.1:8000", timeout: 2s}
      - type: token-producer
        name: estimate-hd
        parameters:
          estimate:
            image: {defaultResolution: {width: 1280, height: 720}}
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal

import orjson
from prometheus_client import Counter
from xxhash import xxh64_intdigest

from epp.plugin import (
    DEFAULT_PRODUCE_TIMEOUT,
    TOKENIZED_PROMPT,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    RequestBody,
    TokenizedPrompt,
)
from epp.plugin.metrics import metric_family
from epp.plugin.prefix import TOKEN_BYTES, pack_token_ids
from epp.plugin.units import parse_duration
from epp.plugins.producers.media_estimate import (
    MediaEstimate,
    audio_tokens,
    base64_image_size,
    data_url_size,
    video_meta,
)
from epp.plugins.producers.render import RenderClient, RenderError

IMAGE_PLACEHOLDERS: Final = 640 * 360 // 1024
ANTHROPIC_BILLING_PREFIX: Final = "x-anthropic-billing-header"


FALLBACKS_METRIC: Final = "llm_d_epp_token_producer_fallbacks"


@dataclass(frozen=True)
class VllmBackendConfig:
    url: str = "http://localhost:8000"
    timeout: str = "5s"
    mm_timeout: str = "30s"

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"vllm.url must be an http(s) URL, got {self.url!r}")
        for key, value in (("timeout", self.timeout), ("mmTimeout", self.mm_timeout)):
            if parse_duration(value) <= 0:
                raise ValueError(f"vllm.{key} must be > 0, got {value!r}")


class TokenProducer(PluginBase):
    TYPE: ClassVar[str] = "token-producer"

    @dataclass(frozen=True)
    class Params:
        backend: Literal["estimate", "vllm"] | None = None
        model_name: str = ""
        vllm: VllmBackendConfig | None = None
        estimate: MediaEstimate | None = None

        def __post_init__(self) -> None:
            implied = self.vllm is not None or bool(self.model_name)
            if self.backend is None and implied and self.estimate is not None:
                raise ValueError(
                    "only one of 'estimate' and 'vllm'/'modelName' may be set "
                    "(or say 'backend: vllm' to tune the estimate it falls back to)"
                )
            if self.selected == "vllm" and not self.model_name:
                raise ValueError("modelName is required with the vllm backend")

        @property
        def selected(self) -> Literal["estimate", "vllm"]:
            """The backend: ``backend`` if set, else ``vllm`` when ``vllm`` or ``modelName``
            is (upstream's rule), else ``estimate``."""
            if self.backend is not None:
                return self.backend
            return "vllm" if self.vllm is not None or self.model_name else "estimate"

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._key = TOKENIZED_PROMPT.key(self.typed_name.name)
        self._log = handle.logger(self.typed_name)
        self._render: RenderClient | None = None
        self._media = self.params.estimate or MediaEstimate()
        if self.params.selected == "vllm":
            cfg = self.params.vllm or VllmBackendConfig()
            self._render = RenderClient(
                url=cfg.url,
                model=self.params.model_name,
                timeout=parse_duration(cfg.timeout),
                mm_timeout=parse_duration(cfg.mm_timeout),
            )
            self._fallbacks = metric_family(
                handle.registry,
                Counter,
                FALLBACKS_METRIC,
                "Requests the vllm backend could not tokenize (estimated instead), by reason.",
                ("plugin_name", "reason"),
            )

    def produces(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key})

    def produce_timeout(self) -> float:
        """How long this producer may take (upstream's ``ProduceTimeout``)."""
        render = self._render
        return (
            max(render.timeout, render.mm_timeout)
            if render is not None
            else DEFAULT_PRODUCE_TIMEOUT
        )

    async def start(self) -> None:
        """Nothing to start: the render client opens its session on first use."""

    async def stop(self) -> None:
        if self._render is not None:
            await self._render.close()

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        body = request.body
        if body is None:
            return
        prompt: TokenizedPrompt | None = None
        if self._render is not None and self._render.supports(body):
            try:
                prompt = await self._render.render(body)
            except RenderError as exc:
                self._fallbacks.labels(self.typed_name.name, exc.reason).inc()
                self._log.debug("request %s: render failed (%s)", request.request_id, exc)
        if prompt is None:
            prompt = estimate(body, self._media, request.headers)
        if prompt is not None:
            request.attributes[self._key] = prompt
        elif self._log.isEnabledFor(logging.DEBUG):
            self._log.debug("request %s (%s): nothing to tokenize", request.request_id, body.kind)


_DEFAULT_MEDIA: Final = MediaEstimate()
_NO_HEADERS: Final[Mapping[str, str]] = MappingProxyType({})


def estimate(
    body: RequestBody,
    media: MediaEstimate = _DEFAULT_MEDIA,
    headers: Mapping[str, str] = _NO_HEADERS,
) -> TokenizedPrompt | None:
    """The ``estimate`` backend: a request body → its pseudo-token prompt(s), or ``None``.
    ``media`` sizes the media items; ``headers`` are the request's (its video headers)."""
    if body.token_ids is not None:
        return TokenizedPrompt((pack_token_ids(body.token_ids),), body.cache_salt)
    payload = body.payload
    serialise = _SERIALISERS.get(body.kind)
    if payload is None or serialise is None:
        return None
    prompts = serialise(payload, _Media(media, headers))
    return TokenizedPrompt(tuple(_aligned(p) for p in prompts), body.cache_salt)


class _Media:
    """One request's media sizing: the configured estimates and its video headers."""

    __slots__ = ("_config", "_headers")

    def __init__(self, config: MediaEstimate, headers: Mapping[str, str]) -> None:
        self._config = config
        self._headers = headers

    def image(self, url: str) -> int:
        return self._config.image.tokens(data_url_size(url))

    def base64_image(self, data: str) -> int:
        return self._config.image.tokens(base64_image_size(data))

    def video(self) -> int:
        return self._config.video.tokens(video_meta(self._headers))


def _aligned(raw: bytes | bytearray) -> bytes:
    """``raw`` padded to whole tokens, copied once (a serialiser's buffer is its own to pad)."""
    pad = -len(raw) % TOKEN_BYTES
    if isinstance(raw, bytearray):
        raw += b"\0" * pad
        return bytes(raw)
    return raw + b"\0" * pad if pad else raw


def _json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _chat(payload: Mapping[str, Any], media: _Media) -> list[bytes | bytearray]:
    out = bytearray()
    tools = payload.get("tools")
    if tools:
        out += _json(tools)
    for message in _objects(payload.get("messages")):
        _append_text(out, message.get("role"))
        content = message.get("content")
        if isinstance(content, str):
            out += content.encode()
        else:
            for block in _objects(content):
                _chat_block(out, block, media)
    return [out]


def _chat_block(out: bytearray, block: Mapping[str, Any], media: _Media) -> None:
    kind = block.get("type")
    if kind == "text":
        _append_text(out, block.get("text"))
    elif kind == "image_url":
        url = _url(block.get("image_url"))
        _placeholders(out, url, media.image(url))
    elif kind == "video_url":
        _placeholders(out, _url(block.get("video_url")), media.video())
    elif kind == "audio_url":
        _placeholders(out, _url(block.get("audio_url")), audio_tokens(""))
    elif kind == "input_audio":
        audio = block.get("input_audio")
        audio = audio if isinstance(audio, Mapping) else {}
        data, fmt = str(audio.get("data") or ""), str(audio.get("format") or "")
        _placeholders(out, data + fmt, audio_tokens(data))


def _completions(payload: Mapping[str, Any], media: _Media) -> list[bytes | bytearray]:
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return [prompt.encode()]
    if isinstance(prompt, list):
        return [p.encode() for p in prompt if isinstance(p, str)]
    return []


def _responses(payload: Mapping[str, Any], media: _Media) -> list[bytes | bytearray]:
    parts: list[dict[str, Any]] = []
    for key in ("instructions", "tools"):
        if payload.get(key) is not None:
            parts.append({key: payload[key]})
    parts.append({"input": payload.get("input")})
    return [_json(parts)]


def _anthropic(payload: Mapping[str, Any], media: _Media) -> list[bytes | bytearray]:
    out = bytearray()
    tools = payload.get("tools")
    if tools:
        out += _json(tools)
    system = payload.get("system")
    if isinstance(system, str):
        out += system.encode()
    else:
        # The billing header block changes on every request and would defeat prefix caching.
        for block in _objects(system):
            text = block.get("text")
            if (
                block.get("type") == "text"
                and isinstance(text, str)
                and not text.startswith(ANTHROPIC_BILLING_PREFIX)
            ):
                out += text.encode()
    for message in _objects(payload.get("messages")):
        _append_text(out, message.get("role"))
        content = message.get("content")
        if isinstance(content, str):
            out += content.encode()
        else:
            for block in _objects(content):
                _anthropic_block(out, block, media)
    return [out]


def _anthropic_block(out: bytearray, block: Mapping[str, Any], media: _Media) -> None:
    kind = block.get("type")
    if kind == "text":
        _append_text(out, block.get("text"))
    elif kind == "thinking":
        _append_text(out, block.get("thinking"))
    elif kind == "image":
        _anthropic_image(out, block.get("source"), media)
    elif kind == "tool_use":
        _append_text(out, block.get("id"))
        _append_text(out, block.get("name"))
        if "input" in block:
            out += orjson.dumps(block["input"])
    elif kind == "tool_result":
        content = block.get("content")
        if isinstance(content, str):
            out += content.encode()
        else:
            items = _objects(content)
            texts = [b.get("text") for b in items if b.get("type") == "text"]
            out += "\n".join(t for t in texts if isinstance(t, str)).encode()
            for item in items:
                if item.get("type") == "image":
                    _anthropic_image(out, item.get("source"), media)


def _anthropic_image(out: bytearray, source: Any, media: _Media) -> None:
    if not isinstance(source, Mapping):
        return
    url, data = source.get("url"), source.get("data")
    if isinstance(url, str) and url:
        _placeholders(out, url, media.image(url))
    elif isinstance(data, str) and data:
        _placeholders(out, data, media.base64_image(data))


def _objects(value: Any) -> list[Mapping[str, Any]]:
    """The JSON objects of an array (anything else is skipped: the parser validated the shape,
    but a producer must not fail on a body another parser let through)."""
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, Mapping)]


def _append_text(out: bytearray, value: Any) -> None:
    if isinstance(value, str):
        out += value.encode()


def _url(value: Any) -> str:
    url = value.get("url") if isinstance(value, Mapping) else None
    return url if isinstance(url, str) else ""


def _placeholders(out: bytearray, content: str, count: int) -> None:
    """Align to a token boundary (media never shares a pseudo-token with text), then append
    ``count`` copies of the asset's pseudo-token."""
    out += b"\0" * (-len(out) % TOKEN_BYTES)
    token = (xxh64_intdigest(content.encode()) & 0xFFFFFFFF).to_bytes(TOKEN_BYTES, "little")
    out += token * count


_Serialiser = Callable[[Mapping[str, Any], _Media], list[bytes | bytearray]]
_SERIALISERS: Final[Mapping[str, _Serialiser]] = {
    "chat": _chat,
    "completions": _completions,
    "embeddings": lambda p, _: [_json(p.get("input"))],
    "conversations": lambda p, _: [_json(p.get("items"))],
    "responses": _responses,
    "anthropic-messages": _anthropic,
}


class Tokenizer(TokenProducer):
    """``tokenizer``: upstream's deprecated name of ``token-producer`` (module docstring)."""

    TYPE: ClassVar[str] = "tokenizer"

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._log.warning(
            "plugin type 'tokenizer' is deprecated; use 'token-producer' instead (plugin %r)",
            self.typed_name.name,
        )
