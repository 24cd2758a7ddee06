"""Which response bodies the EPP reads: decided once per response, at its headers.

A streamed (SSE) answer costs one ext_proc message pair per token. The EPP reads such a body only
when something needs it:

- the request's model name was rewritten (every chunk gets the client's name back);
- flow control is on (a completed request's output tokens go to the fairness policy);
- a configured ``ResponseStreaming`` or ``ResponseComplete`` plugin needs it: one without the
  ``ResponseBodyNeed`` capability always does, one with it says so per response (the
  ``response-affinity-filter`` for a Responses API answer, whose first event carries the id);
- the response is sampled for the response metrics: a fraction ``sample_ratio`` of the streamed
  responses that nothing else needs (``--response-body-sample-ratio``, default 1: every one, so
  the response metrics count every request as llm-d's EPP does), drawn at random. Below 1, TTFT,
  inter-token latency, time per output token, token counts and response size are recorded for
  the sample only: their quantiles hold, their counts and sums cover the sample.

A non-streamed response (held to its end, a message or two) and a response without a routing
decision (header-only requests) are always read. For a skipped body the
ext_proc server asks the gateway not to send it (``epp.server.stream``), and hands back untouched
whatever chunks still arrive; completion (in-flight release, completion hooks, request metrics)
comes when the response ends either way.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable

from epp.plugin import InferenceRequest, ResponseBodyNeed, ResponseInfo

log = logging.getLogger(__name__)

DEFAULT_SAMPLE_RATIO = 1.0
"""Share of the streamed responses nothing else needs that are read for the response metrics."""


class BodyNeed:
    """Decides per response whether its body is read (see the module docstring). ``hooks`` are
    the configured ``ResponseStreaming`` and ``ResponseComplete`` plugins (a plugin in both roles
    may appear twice); ``sample_ratio`` 0 reads no body for the metrics, 1 reads every one."""

    def __init__(
        self,
        hooks: Iterable[object],
        *,
        flow_controlled: bool,
        sample_ratio: float = DEFAULT_SAMPLE_RATIO,
        rng: random.Random | None = None,
    ) -> None:
        unique = list({id(h): h for h in hooks}.values())
        self._always = flow_controlled or any(not isinstance(h, ResponseBodyNeed) for h in unique)
        self._askers = tuple(h for h in unique if isinstance(h, ResponseBodyNeed))
        self._ratio = min(max(sample_ratio, 0.0), 1.0)
        self._rng = rng or random.Random()

    def wanted(self, request: InferenceRequest, info: ResponseInfo, *, rewritten: bool) -> bool:
        """Whether the body of this streamed, routed response is read."""
        if self._always or rewritten:
            return True
        for plugin in self._askers:
            try:
                if plugin.needs_response_body(request, info):
                    return True
            except Exception:
                log.exception(
                    "needs_response_body failed", extra={"request_id": request.request_id}
                )
                return True
        return self._ratio > 0.0 and self._rng.random() < self._ratio
