"""Client of vLLM's render endpoints, for ``token-producer``'s ``vllm`` backend.

Precise prefix matching needs the engine's own token ids. vLLM renders a request (chat template,
tokenizer, ``cache_salt``) without running it at ``POST /v1/completions/render`` (a list with one
``{"token_ids": [...]}`` per prompt) and ``POST /v1/chat/completions/render`` (one object). The
request body is sent as the client wrote it, with ``model`` set to the configured model and
streaming turned off. vLLM 0.32 serves these endpoints only with ``--enable-scale-out`` (403
otherwise); the simulator always does.

Any failure (connection, timeout, non-200, unexpected JSON) raises ``RenderError`` with a short
reason; the token producer then falls back to its estimate and counts the reason. Requests with
media use the longer ``mm_timeout``. Multimodal hashes in the answer are not used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import aiohttp
import orjson

from epp.plugin import RequestBody, TokenizedPrompt

RENDER_PATHS: Final[Mapping[str, str]] = {
    "completions": "/v1/completions/render",
    "chat": "/v1/chat/completions/render",
}
_MEDIA_TYPES: Final = frozenset({"image_url", "video_url", "input_audio", "audio_url"})


class RenderError(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class RenderClient:
    def __init__(self, *, url: str, model: str, timeout: float, mm_timeout: float) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.mm_timeout = mm_timeout
        self._session: aiohttp.ClientSession | None = None

    def supports(self, body: RequestBody) -> bool:
        return body.kind in RENDER_PATHS and body.payload is not None and body.token_ids is None

    async def render(self, body: RequestBody) -> TokenizedPrompt:
        """The engine's token ids for ``body`` (``supports(body)`` must hold)."""
        assert body.payload is not None
        request = {k: v for k, v in body.payload.items() if k != "stream_options"}
        request["stream"] = False
        if self.model:
            request["model"] = self.model
        timeout = self.mm_timeout if _has_media(body.payload) else self.timeout
        session = self._session
        if session is None or session.closed:
            session = self._session = aiohttp.ClientSession()
        try:
            async with session.post(
                self.url + RENDER_PATHS[body.kind],
                data=orjson.dumps(request),
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise RenderError(f"http_{resp.status}", raw[:200].decode(errors="replace"))
        except TimeoutError:
            raise RenderError("timeout") from None
        except aiohttp.ClientError as exc:
            raise RenderError("connection", str(exc)) from None
        return TokenizedPrompt.from_token_ids(_token_lists(raw), body.cache_salt)

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _token_lists(raw: bytes) -> list[list[int]]:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise RenderError("bad_response", "not JSON") from None
    items = doc if isinstance(doc, list) else [doc]
    out: list[list[int]] = []
    for item in items:
        ids = item.get("token_ids") if isinstance(item, Mapping) else None
        if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < 2**32 for t in ids):
            raise RenderError("bad_response", "no token_ids list")
        out.append(ids)
    if not out:
        raise RenderError("bad_response", "empty list")
    return out


def _has_media(payload: Mapping[str, Any]) -> bool:
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and any(
            isinstance(part, Mapping) and part.get("type") in _MEDIA_TYPES for part in content
        ):
            return True
    return False
