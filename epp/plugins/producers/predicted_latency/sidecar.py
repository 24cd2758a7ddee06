"""Client of llm-d's latency-predictor sidecar (``llm-d-latency-predictor``), over its HTTP JSON
API, configured from the environment variables llm-d's Helm chart sets on the EPP container.

Endpoints (as llm-d-router's ``latencypredictorclient`` calls them):

- ``POST <prediction url>/predict/bulk/strict`` ``{"requests": [PredictionRequest...]}`` →
  ``{"predictions": [{"ttft_ms", "tpot_ms", ...}...], ...}``, one prediction per request, in order,
  or a non-200 status. A random one of the prediction URLs is used per call.
- ``POST <training url>/add_training_data_bulk`` ``{"entries": [TrainingEntry...]}`` → 202.
- ``GET <prediction url>/status`` and ``GET <training url>/model/download/info``: the model type
  and readiness, kept for ``dump_state``.

Environment (upstream's names and defaults): ``TRAINING_SERVER_URL``, ``PREDICTION_SERVER_URL``
(comma-separated); when neither is set there is no sidecar (the producer uses its in-process
model), when only one is, the other takes upstream's default (``http://localhost:8000`` /
``http://localhost:8001``). ``LATENCY_MAX_SAMPLE_SIZE`` (1000: entries per training flush, a
stratified random sample of the TTFT and TPOT entries when more are buffered),
``LATENCY_FLUSH_INTERVAL_SEC`` (1), ``LATENCY_HTTP_TIMEOUT_SEC`` (10: every call's bound),
``LATENCY_METRICS_INTERVAL_SEC`` (60: status refresh), ``LATENCY_MAX_BULK_SIZE`` (100, at most
100: rows per prediction call; more candidates are sent as several calls where upstream fails),
``LATENCY_COALESCE_WINDOW_MS`` (1: concurrent requests' rows within the window go in one call; 0
sends each alone), ``LATENCY_MAX_COALESCED_ROWS`` (0: no cap; at the cap a batch goes at once),
``LATENCY_MAX_CONCURRENT_DISPATCHES`` (36: prediction calls in flight at once). A value that is not
a positive integer is ignored, as upstream does. ``LATENCY_USE_NATIVE_XGBOOST`` is accepted and
has no effect: every prediction goes over HTTP.

Deviations: the training buffer is bounded (10 x ``LATENCY_MAX_SAMPLE_SIZE`` entries, the oldest
dropped and counted; upstream's grows until the next flush), and a prediction call waits no longer
than the producer's budget (the Director cancels it, the request is routed without predictions).
All I/O runs on the event loop: the prediction call inside ``produce``, flushes and refreshes in
the client's own task (started and stopped with the producer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

DEFAULT_TRAINING_URL: Final = "http://localhost:8000"
DEFAULT_PREDICTION_URL: Final = "http://localhost:8001"
STOP_FLUSH_TIMEOUT: Final = 2.0
"""Seconds the last training flush may take when the producer stops."""


class SidecarError(Exception):
    """A prediction call failed (connection, status, or an answer of the wrong shape)."""


def _positive_int(env: Mapping[str, str], name: str, default: int, upper: int = 0) -> int:
    text = env.get(name, "").strip()
    try:
        value = int(text)
    except ValueError:
        return default
    if value <= 0 or (upper and value > upper):
        return default
    return value


@dataclass(frozen=True)
class SidecarConfig:
    training_url: str
    prediction_urls: tuple[str, ...]
    max_sample_size: int = 1000
    flush_interval: float = 1.0
    http_timeout: float = 10.0
    metrics_refresh_interval: float = 60.0
    max_bulk_size: int = 100
    coalesce_window: float = 0.001
    max_coalesced_rows: int = 0
    max_concurrent_dispatches: int = 36

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SidecarConfig | None:
        """The sidecar the environment names, or ``None`` when it names none."""
        training = env.get("TRAINING_SERVER_URL", "").strip()
        predictions = tuple(
            u.strip() for u in env.get("PREDICTION_SERVER_URL", "").split(",") if u.strip()
        )
        if not training and not predictions:
            return None
        window_text = env.get("LATENCY_COALESCE_WINDOW_MS", "").strip()
        window_ms = int(window_text) if window_text.isdigit() else 1
        rows_text = env.get("LATENCY_MAX_COALESCED_ROWS", "").strip()
        return cls(
            training_url=(training or DEFAULT_TRAINING_URL).rstrip("/"),
            prediction_urls=tuple(u.rstrip("/") for u in predictions) or (DEFAULT_PREDICTION_URL,),
            max_sample_size=_positive_int(env, "LATENCY_MAX_SAMPLE_SIZE", 1000),
            flush_interval=float(_positive_int(env, "LATENCY_FLUSH_INTERVAL_SEC", 1)),
            http_timeout=float(_positive_int(env, "LATENCY_HTTP_TIMEOUT_SEC", 10)),
            metrics_refresh_interval=float(_positive_int(env, "LATENCY_METRICS_INTERVAL_SEC", 60)),
            max_bulk_size=_positive_int(env, "LATENCY_MAX_BULK_SIZE", 100, upper=100),
            coalesce_window=window_ms / 1000.0,
            max_coalesced_rows=int(rows_text) if rows_text.isdigit() else 0,
            max_concurrent_dispatches=_positive_int(env, "LATENCY_MAX_CONCURRENT_DISPATCHES", 36),
        )


Prediction = tuple[float, float]
"""(TTFT ms, TPOT ms)."""
_Batch = list[tuple[list[dict[str, Any]], "asyncio.Future[list[Prediction]]"]]


class SidecarClient:
    """Predictions (coalesced across concurrent requests) and buffered training for one
    producer. ``start`` and ``stop`` run on the event loop that serves requests."""

    def __init__(self, config: SidecarConfig, log: logging.Logger) -> None:
        self.config = config
        self._log = log
        self._rng = random.Random()
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._sem: asyncio.Semaphore | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._batch: _Batch = []
        self._batch_rows = 0
        self._timer: asyncio.TimerHandle | None = None
        self._training: deque[dict[str, Any]] = deque(maxlen=10 * config.max_sample_size)
        self.status: dict[str, Any] = {}
        self.model_info: dict[str, Any] = {}
        self.counts = {"predictCalls": 0, "predictFailures": 0, "trainingSent": 0,
                       "trainingDropped": 0, "flushFailures": 0}  # fmt: skip
        self.last_error = ""

    @property
    def started(self) -> bool:
        return self._session is not None

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.config.http_timeout)
        self._session = aiohttp.ClientSession(timeout=timeout)
        self._sem = asyncio.Semaphore(self.config.max_concurrent_dispatches)
        await self._refresh()
        self._task = asyncio.create_task(self._loop(), name="latency-predictor-sidecar")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for _, future in self._batch:
            if not future.done():
                future.set_exception(SidecarError("latency predictor client stopped"))
        self._batch, self._batch_rows = [], 0
        for task in list(self._inflight):
            task.cancel()
        if self._session is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(STOP_FLUSH_TIMEOUT):
                    await self._flush()
            await self._session.close()
            self._session = None

    # ---- predictions -------------------------------------------------------------------------

    async def predict(self, rows: list[dict[str, Any]]) -> list[Prediction]:
        """One (TTFT, TPOT) per row, in order; ``SidecarError`` when the sidecar does not
        answer with exactly that."""
        if self._session is None:
            raise SidecarError("latency predictor client not started")
        size = self.config.max_bulk_size
        if len(rows) > size:  # upstream fails such a request; send it in parts
            parts = [rows[i : i + size] for i in range(0, len(rows), size)]
            answers = await asyncio.gather(*(self.predict(part) for part in parts))
            return [p for answer in answers for p in answer]
        if self.config.coalesce_window <= 0:
            return await self._post_predictions(rows)
        return await self._submit(rows)

    def _submit(self, rows: list[dict[str, Any]]) -> asyncio.Future[list[Prediction]]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Prediction]] = loop.create_future()
        self._batch.append((rows, future))
        self._batch_rows += len(rows)
        cap = self.config.max_coalesced_rows
        if cap and self._batch_rows >= cap:
            self._dispatch()
        elif self._timer is None:
            self._timer = loop.call_later(self.config.coalesce_window, self._dispatch)
        return future

    def _dispatch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._batch, self._batch_rows = self._batch, [], 0
        if batch:
            task = asyncio.create_task(self._send_batch(batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _send_batch(self, batch: _Batch) -> None:
        assert self._sem is not None
        rows = [row for part, _ in batch for row in part]
        try:
            async with self._sem:
                answers = await self._post_predictions(rows)
        except Exception as exc:  # every waiter of the batch gets the failure
            for _, future in batch:
                if not future.done():
                    future.set_exception(
                        exc if isinstance(exc, SidecarError) else SidecarError(repr(exc))
                    )
            return
        offset = 0
        for part, future in batch:
            if not future.done():
                future.set_result(answers[offset : offset + len(part)])
            offset += len(part)

    async def _post_predictions(self, rows: Sequence[dict[str, Any]]) -> list[Prediction]:
        assert self._session is not None
        url = self._rng.choice(self.config.prediction_urls) + "/predict/bulk/strict"
        self.counts["predictCalls"] += 1
        try:
            async with self._session.post(url, json={"requests": list(rows)}) as r:
                if r.status != 200:
                    text = (await r.text())[:200]
                    raise SidecarError(f"{url}: status {r.status}: {text}")
                body = await r.json(content_type=None)
            predictions = body["predictions"]
            if not isinstance(predictions, list) or len(predictions) != len(rows):
                raise SidecarError(f"{url}: {len(rows)} rows sent, answer does not match")
            return [(float(p["ttft_ms"]), float(p.get("tpot_ms", 0.0))) for p in predictions]
        except SidecarError as exc:
            self._failed(str(exc))
            raise
        except (aiohttp.ClientError, TimeoutError, KeyError, TypeError, ValueError) as exc:
            self._failed(f"{url}: {exc!r}")
            raise SidecarError(f"{url}: {exc!r}") from exc

    def _failed(self, message: str) -> None:
        self.counts["predictFailures"] += 1
        self.last_error = message

    # ---- training ----------------------------------------------------------------------------

    def add_training(self, entry: dict[str, Any]) -> None:
        """Buffer one training entry (O(1)); the client's task sends it at the next flush."""
        if len(self._training) == self._training.maxlen:
            self.counts["trainingDropped"] += 1
        self._training.append(entry)

    @property
    def buffered(self) -> int:
        return len(self._training)

    async def _flush(self) -> None:
        if not self._training or self._session is None:
            return
        batch = list(self._training)
        self._training.clear()
        batch = stratified_sample(batch, self.config.max_sample_size, self._rng)
        url = self.config.training_url + "/add_training_data_bulk"
        try:
            async with self._session.post(url, json={"entries": batch}) as r:
                await r.read()
                if r.status != 202:
                    raise SidecarError(f"{url}: status {r.status}")
            self.counts["trainingSent"] += len(batch)
        except (aiohttp.ClientError, TimeoutError, SidecarError) as exc:
            self.counts["flushFailures"] += 1
            self.last_error = f"{url}: {exc!r}"
            self._log.debug("latency predictor training flush failed: %r", exc)

    async def _get_json(self, url: str) -> dict[str, Any]:
        assert self._session is not None
        try:
            async with self._session.get(url) as r:
                if r.status != 200:
                    return {}
                body = await r.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self._log.debug("latency predictor %s: %r", url, exc)
            return {}
        return body if isinstance(body, dict) else {}

    async def _refresh(self) -> None:
        status_url = self._rng.choice(self.config.prediction_urls) + "/status"
        self.status = await self._get_json(status_url) or self.status
        info_url = self.config.training_url + "/model/download/info"
        self.model_info = await self._get_json(info_url) or self.model_info

    async def _loop(self) -> None:
        cfg = self.config
        since_refresh = 0.0
        while True:
            await asyncio.sleep(cfg.flush_interval)
            await self._flush()
            since_refresh += cfg.flush_interval
            if since_refresh >= cfg.metrics_refresh_interval:
                since_refresh = 0.0
                await self._refresh()

    def state(self) -> dict[str, Any]:
        return {
            "trainingUrl": self.config.training_url,
            "predictionUrls": list(self.config.prediction_urls),
            "modelType": self.status.get("model_type") or self.model_info.get("model_type", ""),
            "ready": bool(self.status.get("is_ready", False)),
            "trainingBuffered": self.buffered,
            **self.counts,
            "lastError": self.last_error,
        }


def stratified_sample(
    entries: list[dict[str, Any]], size: int, rng: random.Random
) -> list[dict[str, Any]]:
    """At most ``size`` entries, the TTFT, TPOT and other entries in their proportions (the
    largest group takes the rounding), each group sampled at random (upstream's rule)."""
    if len(entries) <= size:
        return entries
    groups: list[list[dict[str, Any]]] = [[], [], []]
    for entry in entries:
        if entry.get("actual_ttft_ms", 0) > 0:
            groups[0].append(entry)
        elif entry.get("actual_tpot_ms", 0) > 0:
            groups[1].append(entry)
        else:
            groups[2].append(entry)
    quotas = [len(g) * size // len(entries) for g in groups]
    largest = max(range(3), key=lambda i: (len(groups[i]), -i))
    quotas[largest] += size - sum(quotas)
    out: list[dict[str, Any]] = []
    for group, quota in zip(groups, quotas, strict=True):
        out += rng.sample(group, min(quota, len(group)))
    return out
