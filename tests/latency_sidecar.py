"""A small HTTP server on 127.0.0.1 that speaks llm-d's latency-predictor sidecar protocol
(``/predict/bulk/strict``, ``/add_training_data_bulk``, ``/status``,
``/model/download/info``), for tests of ``predicted-latency-producer``'s client.

It is not the sidecar's model: it answers every prediction with a fixed linear function of the
request's features (``ttft_ms = base_ttft + per_token * uncached tokens + per_waiting * waiting``,
``tpot_ms = base_tpot + per_running * running``), so a test knows the exact answer for each
endpoint. It records what it was sent, and can be told to fail (``status``), to answer late
(``delay``) or with the wrong number of predictions (``short``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class SidecarServer:
    base_ttft: float = 50.0
    per_token: float = 0.1
    per_waiting: float = 20.0
    base_tpot: float = 10.0
    per_running: float = 1.0
    status: int = 200
    delay: float = 0.0
    short: bool = False
    predict_calls: list[list[dict[str, Any]]] = field(default_factory=list)
    training: list[dict[str, Any]] = field(default_factory=list)
    gets: list[str] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ttft(self, row: dict[str, Any]) -> float:
        uncached = row["input_token_length"] * (1.0 - row["prefix_cache_score"])
        return (
            self.base_ttft
            + self.per_token * uncached
            + self.per_waiting * row["num_request_waiting"]
        )

    def tpot(self, row: dict[str, Any]) -> float:
        return self.base_tpot + self.per_running * row["num_request_running"]

    async def __aenter__(self) -> SidecarServer:
        app = web.Application()
        app.router.add_post("/predict/bulk/strict", self._predict)
        app.router.add_post("/add_training_data_bulk", self._train)
        app.router.add_get("/status", self._status)
        app.router.add_get("/model/download/info", self._info)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _predict(self, request: web.Request) -> web.Response:
        rows = (await request.json())["requests"]
        self.predict_calls.append(rows)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.status != 200:
            return web.Response(status=self.status, text="model not ready")
        predictions = [
            {"ttft_ms": self.ttft(r), "tpot_ms": self.tpot(r), "model_type": "xgboost"}
            for r in rows
        ]
        if self.short:
            predictions = predictions[:-1]
        return web.json_response(
            {
                "predictions": predictions,
                "total_requests": len(rows),
                "successful_predictions": len(predictions),
                "failed_predictions": 0,
                "processing_time_ms": 0.1,
            }
        )

    async def _train(self, request: web.Request) -> web.Response:
        self.training.extend((await request.json())["entries"])
        return web.json_response({"message": "accepted"}, status=202)

    async def _status(self, request: web.Request) -> web.Response:
        self.gets.append("/status")
        return web.json_response(
            {"is_ready": True, "model_type": "xgboost", "quantile": 0.9, "models_exist": {}}
        )

    async def _info(self, request: web.Request) -> web.Response:
        self.gets.append("/model/download/info")
        return web.json_response({"model_type": "xgboost", "model_status": {"ttft": True}})
