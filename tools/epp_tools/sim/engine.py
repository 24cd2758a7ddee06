"""Engine model of the simulator: continuous batching over a prefix-cached KV pool.

Pure and synchronous; the caller owns the (virtual) clock and passes ``now`` in seconds.

Scheduling (one engine *step* at a time, like vLLM's scheduler loop):

1. Running requests first: each decoding request needs room for one more token of KV; when the
   pool is full the most recently admitted request is preempted (blocks released, put back at
   the head of the waiting queue, recomputed later: vLLM's RECOMPUTE preemption).
2. Then waiting requests in FIFO order while ``len(running) < max_num_seqs``: a request whose
   LoRA adapter is not loaded and would need a slot beyond ``max_loras`` is skipped (it waits
   until a slot frees; later requests may pass it); a request that does not fit in the KV pool
   stops admission (head-of-line, as vLLM does).
3. An admitted request looks up its chained block hashes: the longest cached prefix is reused
   (capped so at least one prompt token is computed, as vLLM does) and the remaining blocks are
   allocated; full blocks are registered in the cache at once (``BlockStored``).

Step duration (simulated seconds)::

    step = (decode_base_ms + decode_per_seq_ms * batch) / 1000
           + uncached_prefill_tokens / prefill_tokens_per_s

where ``batch`` counts every running sequence and ``uncached_prefill_tokens`` sums the prompt
tokens not served from the prefix cache of the requests admitted in this step. At the end of a
step every running request emits one token (a newly admitted one emits its first token, so TTFT
= queueing + one step). A request finishes after ``max_tokens`` tokens; its blocks are released
(cached ones become evictable).

Memory: a request holds its token ids as ``array('I')`` (4 bytes a token, ``compact_ids``), so a
process serving many pods can keep thousands of long prompts in flight.

Prefix-cache counters count tokens like vLLM's: ``prefix_queries`` += prompt tokens and
``prefix_hits`` += reused tokens, once per request.

Remote prefill (P/D decode leg, ``add_request(..., remote=RemoteKV(...))``): the prompt blocks
this pod lacks are pulled from the prefill pod, ``kv_transfer_ms_per_block`` each, while the
request waits (as vLLM's ``WAITING_FOR_REMOTE_KVS``, holding no blocks); then they join this
pod's prefix cache (``BlockStored``) and the request queues: its admission finds them cached and
computes only the last block. Its prefix counters count only the blocks held here before; it
reports the prefill pod's ``cached_tokens`` when given.
"""

from __future__ import annotations

import bisect
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from epp_tools.sim.config import PodConfig
from epp_tools.sim.kvcache import BlockPool, KVEvent, chain_hashes
from epp_tools.sim.stats import EngineStats
from epp_tools.sim.tokenizer import compact_ids, output_seed, output_token

_MAX_STEPS_PER_ADVANCE = 1_000_000  # bounds catch-up after a very late timer


@dataclass(frozen=True)
class RemoteKV:
    """The request's prompt KV comes from a prefill pod; ``reported_cached_tokens`` (if not None)
    is the cached-token count its answer reports."""

    reported_cached_tokens: int | None = None


class RequestRejected(ValueError):
    """The request can never run on this engine (too long for the context or the KV pool)."""


@dataclass(frozen=True)
class TokenEvent:
    request_id: str
    token_id: int
    index: int
    time: float
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int


@dataclass(eq=False)
class _Request:
    request_id: str
    prompt_len: int
    max_tokens: int
    lora: str | None
    lora_id: int | None
    arrival: float
    natural_stop: bool
    tokens: array[int] | list[int]
    """Prompt and generated ids: 4 bytes a token (``compact_ids``); a list only for ids that do
    not fit 32 bits (a token-id prompt sent as such)."""
    seed: int
    chain: list[int] = field(default_factory=list)
    blocks: list[int | None] = field(default_factory=list)
    kv_tokens: int = 0
    pending_prefill: int = 0
    generated: int = 0
    cached_tokens: int = -1
    last_token_time: float = 0.0
    ready: float = 0.0  # end of its KV transfer (remote prefill)
    local_hits: int = -1  # remote prefill: blocks cached here before the transfer
    reported_cached: int | None = None


class Engine:
    def __init__(self, config: PodConfig) -> None:
        self.config = config
        self.pool = BlockPool(config.num_gpu_blocks, config.block_size)
        self.stats = EngineStats()
        self._lora_ids = {name: i + 1 for i, name in enumerate(config.lora_adapters)}
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._transfers: list[_Request] = []  # pulling remote KV, by ``ready``
        self._by_id: dict[str, _Request] = {}
        self._step_end: float | None = None

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + len(self._transfers)

    @property
    def num_transferring(self) -> int:  # waiting for their KV from a prefill pod
        return len(self._transfers)

    @property
    def kv_usage(self) -> float:
        return self.pool.usage

    def running_loras(self) -> list[str]:
        return sorted({r.lora for r in self._running if r.lora})

    def waiting_loras(self) -> list[str]:
        return sorted({r.lora for r in self._waiting if r.lora})

    def next_wakeup(self) -> float | None:
        """Simulated time at which ``advance`` has work to do, or None when idle."""
        landing = self._transfers[0].ready if self._transfers else None
        return min((t for t in (self._step_end, landing) if t is not None), default=None)

    def drain_kv_events(self) -> list[KVEvent]:
        return self.pool.drain_events()

    # ---- commands (the caller runs ``advance`` afterwards to collect outputs) ---------------
    def add_request(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        max_tokens: int | None,
        now: float,
        lora: str | None = None,
        remote: RemoteKV | None = None,
    ) -> None:
        cfg = self.config
        if request_id in self._by_id:
            raise ValueError(f"duplicate request id {request_id!r}")
        if lora is not None and lora not in self._lora_ids:
            raise RequestRejected(f"unknown LoRA adapter {lora!r}")
        if not prompt_ids:
            raise RequestRejected("the prompt is empty")
        natural = max_tokens is None
        out_len = cfg.default_max_tokens if max_tokens is None else max_tokens
        if out_len < 1:
            raise RequestRejected("max_tokens must be at least 1")
        total = len(prompt_ids) + out_len
        if total > cfg.max_model_len:
            raise RequestRejected(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                f"your request has {len(prompt_ids)} input tokens and requests {out_len} output "
                f"tokens ({total} in total)."
            )
        if -(-total // cfg.block_size) > cfg.num_gpu_blocks:
            raise RequestRejected(f"the request needs more than {cfg.num_gpu_blocks} KV blocks")
        req = _Request(
            request_id=request_id,
            prompt_len=len(prompt_ids),
            max_tokens=out_len,
            lora=lora,
            lora_id=self._lora_ids.get(lora) if lora else None,
            arrival=now,
            natural_stop=natural,
            tokens=compact_ids(prompt_ids),
            seed=output_seed(prompt_ids),
        )
        self._by_id[request_id] = req
        self.stats.requests_received += 1
        if remote is None:
            self._waiting.append(req)
        else:
            self._pull(req, remote, now)

    def _pull(self, req: _Request, remote: RemoteKV, now: float) -> None:
        """Start pulling the prompt blocks this pod lacks (P/D decode leg)."""
        cfg = self.config
        chain_hashes(req.tokens, cfg.block_size, req.lora, req.chain)
        req.local_hits = self.pool.match_prefix(req.chain)
        moved = max(0, -(-req.prompt_len // cfg.block_size) - req.local_hits)
        req.ready = now + moved * cfg.kv_transfer_ms_per_block / 1000.0
        req.reported_cached = remote.reported_cached_tokens
        bisect.insort(self._transfers, req, key=lambda r: r.ready)
        self.stats.remote_prefills += 1
        self.stats.kv_transfer_blocks += moved

    def abort_request(self, request_id: str) -> bool:
        req = self._by_id.pop(request_id, None)
        if req is None:
            return False
        if req in self._running:
            self._running.remove(req)
        elif req in self._transfers:
            self._transfers.remove(req)
        else:
            self._waiting.remove(req)
        self.pool.release(req.blocks)
        req.blocks = []
        self.stats.finished["abort"] += 1
        return True

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset()

    def advance(self, now: float) -> list[TokenEvent]:
        """Run every step that ends at or before ``now``; start the next one if there is work."""
        out: list[TokenEvent] = []
        for _ in range(_MAX_STEPS_PER_ADVANCE):
            landing = self._transfers[0].ready if self._transfers else float("inf")
            if landing <= now and (self._step_end is None or landing <= self._step_end):
                self._land(landing)
                if self._step_end is None:
                    self._start_step(landing)
                continue
            if self._step_end is None:
                if not self._waiting:
                    break
                self._start_step(now)
                if self._step_end is None:
                    break
            if self._step_end > now:
                break
            end = self._step_end
            self._finish_step(end, out)
            self._step_end = None
            if self._running or self._waiting:
                self._start_step(end)
        return out

    # ---- step internals ------------------------------------------------------------------
    def _land(self, t: float) -> None:
        """Transfers ending at ``t``: their blocks join the cache, the requests queue."""
        while self._transfers and self._transfers[0].ready <= t:
            req = self._transfers.pop(0)
            self.pool.adopt(req.chain, req.tokens, req.lora_id, req.lora)
            self._waiting.append(req)

    def _start_step(self, t: float) -> None:
        self._reserve_decode_slots()
        self._admit()
        if not self._running:
            self._step_end = None
            return
        cfg = self.config
        prefill = sum(r.pending_prefill for r in self._running)
        decode_ms = cfg.decode_base_ms + cfg.decode_per_seq_ms * len(self._running)
        self._step_end = t + decode_ms / 1000.0 + prefill / cfg.prefill_tokens_per_s

    def _reserve_decode_slots(self) -> None:
        bs = self.config.block_size
        i = 0
        while i < len(self._running):
            req = self._running[i]
            if -(-(req.kv_tokens + 1) // bs) <= len(req.blocks):
                i += 1
                continue
            if self.pool.allocate():
                req.blocks.append(None)
                i += 1
                continue
            victim = self._running.pop()
            self._preempt(victim)
            # if the victim was req itself the loop ends; otherwise retry req

    def _preempt(self, req: _Request) -> None:
        self.pool.release(req.blocks)
        req.blocks = []
        req.kv_tokens = 0
        req.pending_prefill = 0
        self._waiting.appendleft(req)
        self.stats.preemptions += 1

    def _admit(self) -> None:
        cfg = self.config
        loaded = {r.lora for r in self._running if r.lora}
        skipped: list[_Request] = []
        while self._waiting and len(self._running) < cfg.max_num_seqs:
            req = self._waiting[0]
            if req.lora and req.lora not in loaded and len(loaded) >= cfg.max_loras:
                skipped.append(self._waiting.popleft())
                continue
            if not self._try_allocate(req):
                break
            self._waiting.popleft()
            self._running.append(req)
            if req.lora:
                loaded.add(req.lora)
        self._waiting.extendleft(reversed(skipped))

    def _try_allocate(self, req: _Request) -> bool:
        bs = self.config.block_size
        n_tokens = len(req.tokens)
        chain = chain_hashes(req.tokens, bs, req.lora, req.chain)
        hits = self.pool.match_prefix(chain)
        if hits * bs >= n_tokens:  # always compute at least the last token
            hits -= 1
        needed = -(-n_tokens // bs) - hits
        if not self.pool.can_allocate(needed, chain[:hits]):
            return False
        blocks: list[int | None] = []
        for h in chain[:hits]:
            self.pool.acquire(h)
            blocks.append(h)
        for i in range(hits, -(-n_tokens // bs)):
            if not self.pool.allocate():  # cannot happen after can_allocate; stay consistent
                self.pool.release(blocks)
                return False
            if i < len(chain):
                parent = chain[i - 1] if i else None
                self.pool.register(
                    chain[i], parent, req.tokens[i * bs : (i + 1) * bs], req.lora_id, req.lora
                )
                blocks.append(chain[i])
            else:
                blocks.append(None)
        req.blocks = blocks
        req.pending_prefill = n_tokens - hits * bs
        if req.cached_tokens < 0:
            reported = req.reported_cached
            req.cached_tokens = hits * bs if reported is None else reported
            local = hits if req.local_hits < 0 else min(hits, req.local_hits)
            self.stats.prefix_queries += req.prompt_len
            self.stats.prefix_hits += local * bs
            self.stats.prompt_tokens += req.prompt_len
        return True

    def _finish_step(self, t: float, out: list[TokenEvent]) -> None:
        finished: list[_Request] = []
        for req in self._running:
            self._commit_kv(req)
            token = output_token(req.seed, req.generated)
            req.tokens.append(token)
            req.generated += 1
            self.stats.generation_tokens += 1
            if req.generated == 1:
                self.stats.ttft.observe(t - req.arrival)
            else:
                self.stats.itl.observe(t - req.last_token_time)
            req.last_token_time = t
            done = req.generated >= req.max_tokens
            reason = ("stop" if req.natural_stop else "length") if done else None
            out.append(
                TokenEvent(
                    request_id=req.request_id,
                    token_id=token,
                    index=req.generated - 1,
                    time=t,
                    finished=done,
                    finish_reason=reason,
                    prompt_tokens=req.prompt_len,
                    cached_tokens=req.cached_tokens,
                )
            )
            if done:
                finished.append(req)
                self.stats.finished[reason or "length"] += 1
                self.stats.e2e.observe(t - req.arrival)
        for req in finished:
            self._running.remove(req)
            self._by_id.pop(req.request_id, None)
            self.pool.release(req.blocks)
            req.blocks = []

    def _commit_kv(self, req: _Request) -> None:
        """All current tokens now have KV; a block that just filled up joins the prefix cache."""
        bs = self.config.block_size
        before = req.kv_tokens
        req.kv_tokens = len(req.tokens)
        req.pending_prefill = 0
        if req.kv_tokens // bs == before // bs or before == 0:
            return  # no block boundary crossed by decode (prefill registered its own blocks)
        idx = req.kv_tokens // bs - 1
        if req.blocks[idx] is not None:
            return
        chain_hashes(req.tokens[: req.kv_tokens], bs, req.lora, req.chain)
        parent = req.chain[idx - 1] if idx else None
        block_hash = req.chain[idx]
        self.pool.register(
            block_hash, parent, req.tokens[idx * bs : (idx + 1) * bs], req.lora_id, req.lora
        )
        req.blocks[idx] = block_hash
