"""Response bodies and SSE chunks shaped like vLLM's, one formatter per API.

Chat and completions stream ``data: {json}\\n\\n`` chunks and end with ``data: [DONE]\\n\\n``;
with ``stream_options.include_usage`` a last chunk carries ``usage`` and empty ``choices``
(``continuous_usage_stats`` adds the running usage to every chunk). The Responses API streams
typed events (``event: response.output_text.delta`` ...) ending with ``response.completed``,
whose response object carries the usage, and has no ``[DONE]``.

A streamed chat answer opens with the assistant role chunk, which vLLM sends with the first
token's output (``start_with_first_token``), so the first chunk marks the time to first token.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from epp_tools.sim.openai import Parsed, responses_usage, usage


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"


class _Base:
    start_with_first_token = False
    """``start()``'s chunks go out with the first token's rather than before it."""

    def __init__(self, parsed: Parsed, request_id: str) -> None:
        self.parsed = parsed
        self.id = request_id
        self.created = int(time.time())
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generated = 0
        self.kv_transfer_params: dict[str, Any] | None = None  # a P/D prefill leg's answer

    def envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.parsed.model}

    def usage(self) -> dict[str, Any]:
        return usage(self.prompt_tokens, self.generated, self.cached_tokens)


class CompletionFormat(_Base):
    done_marker = True

    def start(self) -> list[bytes]:
        return []

    def token(self, text: str, finish_reason: str | None) -> list[bytes]:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        chunk = {**self.envelope("text_completion"), "choices": [choice]}
        if self.parsed.continuous_usage:
            chunk["usage"] = self.usage()
        return [sse(chunk)]

    def finish(self) -> list[bytes]:
        if not self.parsed.include_usage:
            return []
        return [sse({**self.envelope("text_completion"), "choices": [], "usage": self.usage()})]

    def full(self, texts: list[str], reasons: list[str]) -> dict[str, Any]:
        choices = [
            {
                "index": i,
                "text": text,
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
            for i, (text, reason) in enumerate(zip(texts, reasons, strict=True))
        ]
        body = {**self.envelope("text_completion"), "choices": choices, "usage": self.usage()}
        return {**body, "system_fingerprint": None, "kv_transfer_params": self.kv_transfer_params}


class ChatFormat(_Base):
    done_marker = True
    start_with_first_token = True

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        if finish_reason is not None:
            choice["stop_reason"] = None
        chunk = {**self.envelope("chat.completion.chunk"), "choices": [choice]}
        if self.parsed.continuous_usage:
            chunk["usage"] = self.usage()
        return chunk

    def start(self) -> list[bytes]:
        return [sse(self._chunk({"role": "assistant", "content": ""}, None))]

    def token(self, text: str, finish_reason: str | None) -> list[bytes]:
        return [sse(self._chunk({"content": text}, finish_reason))]

    def finish(self) -> list[bytes]:
        if not self.parsed.include_usage:
            return []
        chunk = {**self.envelope("chat.completion.chunk"), "choices": [], "usage": self.usage()}
        return [sse(chunk)]

    def full(self, texts: list[str], reasons: list[str]) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": texts[0],
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [],
            "reasoning_content": None,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": reasons[0],
            "stop_reason": None,
        }
        body = {**self.envelope("chat.completion"), "choices": [choice], "usage": self.usage()}
        extra = {"service_tier": None, "system_fingerprint": None, "prompt_logprobs": None}
        return {**body, **extra, "kv_transfer_params": self.kv_transfer_params}


class ResponsesFormat(_Base):
    done_marker = False

    def __init__(self, parsed: Parsed, request_id: str) -> None:
        super().__init__(parsed, request_id)
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.seq = 0
        self.text_parts: list[str] = []

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(data, event=kind)

    def _message(self, status: str) -> dict[str, Any]:
        text = "".join(self.text_parts)
        content: list[dict[str, Any]] = [
            {"type": "output_text", "text": text, "annotations": [], "logprobs": None}
        ]
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content if status == "completed" else [],
        }

    def response(self, status: str) -> dict[str, Any]:
        done = status == "completed"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "model": self.parsed.model,
            "status": status,
            "output": [self._message("completed")] if done else [],
            "previous_response_id": self.parsed.previous_response_id,
            "max_output_tokens": self.parsed.max_tokens,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "store": self.parsed.store,
            "usage": responses_usage(self.prompt_tokens, self.generated, self.cached_tokens)
            if done
            else None,
        }

    def start(self) -> list[bytes]:
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            self._event("response.created", response=self.response("in_progress")),
            self._event("response.in_progress", response=self.response("in_progress")),
            self._event(
                "response.output_item.added", output_index=0, item=self._message("in_progress")
            ),
            self._event(
                "response.content_part.added",
                item_id=self.message_id,
                output_index=0,
                content_index=0,
                part=part,
            ),
        ]

    def token(self, text: str, finish_reason: str | None) -> list[bytes]:
        self.text_parts.append(text)
        return [
            self._event(
                "response.output_text.delta",
                item_id=self.message_id,
                output_index=0,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        ]

    def finish(self) -> list[bytes]:
        text = "".join(self.text_parts)
        part = {"type": "output_text", "text": text, "annotations": []}
        ids = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        return [
            self._event("response.output_text.done", **ids, text=text, logprobs=[]),
            self._event("response.content_part.done", **ids, part=part),
            self._event(
                "response.output_item.done", output_index=0, item=self._message("completed")
            ),
            self._event("response.completed", response=self.response("completed")),
        ]

    def full(self, texts: list[str], reasons: list[str]) -> dict[str, Any]:
        self.text_parts = [texts[0]]
        body = self.response("completed")
        if self.kv_transfer_params is not None:
            body["kv_transfer_params"] = self.kv_transfer_params
        return body


Format = CompletionFormat | ChatFormat | ResponsesFormat


def formatter(parsed: Parsed) -> Format:
    hex_id = uuid.uuid4().hex
    if parsed.kind == "completion":
        return CompletionFormat(parsed, f"cmpl-{hex_id}")
    if parsed.kind == "chat":
        return ChatFormat(parsed, f"chatcmpl-{hex_id}")
    return ResponsesFormat(parsed, f"resp_{hex_id}")
