"""``kv-cache-utilization-scorer``: prefer endpoints with free KV-cache (category Distribution).

Formula, with ``kv`` the endpoint's KV-cache usage (a fraction in [0, 1])::

    score = 1 - kv                               # clamped to [0, 1]

Upstream's ``kv`` is the scraped ``metrics.kv_cache_usage_percent`` as it is. Here it is that
usage as of now: the scrape at ``t`` (``Metrics.update_time``), corrected by what this EPP's own
requests changed there since ``t``::

    kv = kv_scraped + (added - released) / (cache_num_blocks * cache_block_size)

    added      prompt tokens of this EPP's requests dispatched there after t, still in flight
    released   tokens held by this EPP's requests dispatched at or before t that completed
               after t (the server's usage: prompt + completion tokens; else the prompt)

The scorer does not ask for response bodies (``ResponseBodyNeed``): a streamed answer the EPP does
not read (``epp.requestcontrol.bodyneed``) releases its prompt tokens, as one without usage does,
so until the next scrape the endpoint looks fuller by that answer's completion tokens.

Why: a scrape is up to one scrape interval old, and the request that just completed on a pod is
usually still in its numbers. An agent sends its next turn the moment the previous answer ends,
so upstream's scorer reads the session's own finished turn as load on the one pod that caches
the session, and steers the turn away (measured on the ``b-pressure`` benchmark with llm-d's
default weights: the KV scorer alone moved about 40 of 250 session turns off their pod). The
correction is exact for this EPP's traffic; other clients' changes since ``t`` show at the next
scrape, as upstream. Without the KV size (``cache_num_blocks`` or ``cache_block_size`` 0, no
``cache_config_info``), with metrics older than ``STALENESS_SECONDS`` (2 s, the EPP's
``--metrics-staleness-threshold`` default) or without anything of this EPP's since ``t``, ``kv``
is the scraped value: upstream's formula exactly. Blocks a finished request shared with requests
still running (a common system prompt) stay in use although they count as released, so the
estimate can be low by that shared part until the next scrape. Prompt tokens come from
``TokenizedPrompt/token-producer`` (created by the loader when no config names it); requests are
recorded at PreRequest and released at ResponseComplete (the tracker and the formula:
``epp.plugin.kvusage``).

An endpoint without metrics scores 0: an unknown cache must not look empty.

It offers ``score_list`` (``ListScorer``): the same scores as a list in candidate order,
which the scheduler sums without lookups; ``score`` is that list keyed by id.

Parameters: none.

YAML::

    plugins:
      - type: kv-cache-utilization-scorer
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: kv-cache-utilization-scorer
            weight: 2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

from epp.plugin import (
    TOKENIZED_PROMPT,
    CycleState,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ResponseInfo,
    SchedulingResult,
    ScorerCategory,
)
from epp.plugin.kvusage import STALENESS_SECONDS, KVTracker, usage_now

TOKEN_PRODUCER: Final = "token-producer"


class KVCacheUtilizationScorer(PluginBase):
    TYPE: ClassVar[str] = "kv-cache-utilization-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._tokens_key = TOKENIZED_PROMPT.key(TOKEN_PRODUCER)
        self.tracker = KVTracker(STALENESS_SECONDS)

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._tokens_key})

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        scores = self.score_list(cycle, request, endpoints)
        return {e.id: s for e, s in zip(endpoints, scores, strict=True)}

    def score_list(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        """``score`` in candidate order (``ListScorer``)."""
        usages = self.tracker.usages(endpoints, self.handle.clock(), STALENESS_SECONDS)
        # ``1 - usage``: 0 without metrics (usage 1), else in [0, 1]
        return [1.0 - u for u in usages]

    def usage(self, endpoint: Endpoint, now: float) -> float:
        """The endpoint's KV-cache usage now, in [0, 1]; 1 without metrics."""
        return usage_now(endpoint, now, self.tracker, STALENESS_SECONDS)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        targets = result.primary.targets
        if targets:
            prompt = request.attributes.get(self._tokens_key)
            tokens = prompt.token_count if prompt is not None else 0
            self.tracker.dispatch(request.request_id, targets[0].id, self.handle.clock(), tokens)

    def needs_response_body(self, request: InferenceRequest, response: ResponseInfo) -> bool:
        return False  # ResponseBodyNeed: without usage, the prompt's tokens are released

    def response_complete(self, request: InferenceRequest, response: ResponseInfo) -> None:
        usage = response.usage
        held = usage.prompt_tokens + usage.completion_tokens if usage.prompt_tokens else 0
        self.tracker.complete(request.request_id, self.handle.clock(), held)
