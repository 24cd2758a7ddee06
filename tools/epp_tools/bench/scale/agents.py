"""One simulated coding agent: its conversation, its next request, and what an oracle could reuse.

An ``Agent`` is a main agent or a sub-agent, with a seeded generator of its own, so the same seed
gives the same agents whatever the timing. All counts are simulated tokens (``Scaling.tokens`` of
the ``AgentShape``'s real ones); one word of ``epp_tools.bench.workloads.text`` is one token.

* A main agent joins with the harness prompt (shared by every agent) and a first user message of
  ``context_median`` (lognormal) tokens: a session that began before the run. Each later turn
  appends the previous answer (exactly the tokens the simulator generated, ``simulated_reply``)
  and a tool result (lognormal ``tool_median``).
* Compaction: when the next prompt would pass ``compact_at``, the turn instead asks for a
  ``summary_tokens`` summary (a ``compact_tokens`` instruction); the conversation becomes the
  harness prompt and a user message of that length (the summary, as new text of the agent's own),
  and grows again from there.
* Sub-agents: after a main-agent turn, with chance ``subagent_chance``, ``fork`` starts a
  sub-agent whose first prompt is the parent's conversation through that answer plus a
  ``subtask_tokens`` task; it runs ``subagent_turns`` turns of its own and ends.
* Responses API: ``responses_share`` of the main agents (and their sub-agents) talk to
  ``/v1/responses``: every turn after the first sends ``previous_response_id`` and the new message
  only (``epp_tools.bench.runner.driver`` resends a follow-up answered 404 as a new chain). After a
  compaction the agent opens a new chain.

Oracle (the achievable reuse ``epp bench scale`` divides by): a request can reuse at most the
longest prefix some earlier request left in KV, in whole blocks of ``block_size`` and leaving at
least one prompt token to compute, as ``epp_tools.bench.workloads.oracle`` defines it. Here that
prefix is known from the token counts: after a turn of prompt ``p`` and answer ``o`` the
conversation's KV covers ``p + o - 1`` tokens (the last generated token is never computed), a
sub-agent's first prompt shares its parent's ``p + o - 1`` (and leaves the parent's whole
conversation and the next message's header for the parent's next turn), and a first prompt (or the
first after a compaction) shares the harness message and the next message's header with every other
agent.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from epp_tools.bench.scale.shape import BLOCK_SIZE, AgentShape, Scaling
from epp_tools.bench.workloads.agentic import simulated_reply
from epp_tools.bench.workloads.spec import MODEL, BenchRequest, Message
from epp_tools.bench.workloads.text import (
    GENERATION_PROMPT_TOKENS,
    header_tokens,
    message_tokens,
    words,
)

MAIN_OBJECTIVE = "agent-main"
SUB_OBJECTIVE = "agent-sub"


def lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(math.log(max(median, 1e-9)), sigma))))


def reusable(common: int, prompt: int, block_size: int = BLOCK_SIZE) -> int:
    """Whole blocks of a ``common``-token prefix, leaving at least one prompt token."""
    return (max(0, min(common, prompt - 1)) // block_size) * block_size


@dataclass(frozen=True)
class Turn:
    """One request of an agent and what the oracle says it could reuse."""

    request: BenchRequest
    prompt_tokens: int
    reusable_tokens: int
    compacting: bool
    added: bool
    """Whether the turn appended a message (every turn but an agent's first)."""


@dataclass
class Agent:
    name: str
    shape: AgentShape
    scaling: Scaling
    rng: random.Random
    system: Message
    api: str = "chat"
    parent: str = ""
    turns_left: int = -1
    """Turns a sub-agent has left (-1: a main agent, no limit)."""
    messages: list[Message] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    turn: int = 0
    response_id: str = ""
    covered: int = 0
    """Tokens of the conversation whose KV an earlier request left (the oracle's prefix)."""
    _pending: Turn | None = None

    @classmethod
    def main(
        cls, name: str, shape: AgentShape, scaling: Scaling, seed: int, system: Message
    ) -> Agent:
        rng = random.Random(seed)
        api = "responses" if rng.random() < shape.responses_share else "chat"
        agent = cls(name, shape, scaling, rng, system, api)
        agent._start_fresh()
        s = scaling
        context = lognormal(
            rng, s.tokens(shape.context_median), shape.context_sigma, 1, s.tokens(shape.context_max)
        )
        agent._add("user", words(rng, context), context)
        return agent

    @property
    def is_sub(self) -> bool:
        return bool(self.parent)

    @property
    def done(self) -> bool:
        return self.turns_left == 0

    def context_tokens(self) -> int:
        """KV the agent's conversation holds now (its working set)."""
        return sum(self.counts) + GENERATION_PROMPT_TOKENS

    def next_turn(self) -> Turn:
        """The next request (call ``answered`` with its outcome before asking again)."""
        if self._pending is not None:
            raise RuntimeError(f"{self.name}: the previous turn is not answered yet")
        out, compacting, added = self._output(), False, self.turn > 0
        if added:
            tool = lognormal(
                self.rng,
                self.scaling.tokens(self.shape.tool_median),
                self.shape.tool_sigma,
                1,
                self.scaling.tokens(self.shape.tool_max),
            )
            limit = self.scaling.tokens(self.shape.compact_at)
            if self.context_tokens() + message_tokens("user", tool) > limit:
                n = self.scaling.tokens(self.shape.compact_tokens)
                self._add("user", words(self.rng, n), n)
                summary = min(self.shape.summary_tokens, self.shape.output_max)
                out, compacting = self.scaling.tokens(summary), True
            else:
                self._add("user", words(self.rng, tool), tool)
        prompt = self.context_tokens()
        objective = SUB_OBJECTIVE if self.is_sub else MAIN_OBJECTIVE
        messages = tuple(self.messages)
        request = BenchRequest(
            self.name, self.turn, MODEL, messages, out, objective=objective, api=self.api
        )
        self._pending = Turn(request, prompt, reusable(self.covered, prompt), compacting, added)
        return self._pending

    def answered(self, ok: bool, response_id: str = "") -> None:
        """Record the pending turn's answer: on success the conversation grows by it (or is
        compacted to it); a failed turn is dropped, and the agent tries a new message next."""
        turn, self._pending = self._pending, None
        if turn is None:
            raise RuntimeError(f"{self.name}: no turn is pending")
        self.turn += 1
        if self.turns_left > 0:
            self.turns_left -= 1
        if not ok:
            if turn.added:
                self.messages.pop()
                self.counts.pop()
            self.response_id = ""
            return
        out = turn.request.max_tokens
        self.covered = turn.prompt_tokens + out - 1
        self.response_id = response_id
        if turn.compacting:
            # The harness starts a new conversation from the summary. The simulator's answers are
            # drawn from 16 words in a fixed cycle, so two agents' summaries could be equal and
            # share KV by accident: the new conversation carries text of the summary's length.
            self._start_fresh()
            self._add("user", words(self.rng, out), out)
            self.response_id = ""  # a new conversation: a new Responses chain
        else:
            reply = simulated_reply(self.messages, turn.prompt_tokens, out)
            self._add("assistant", reply, out)

    def fork(self, index: int) -> Agent | None:
        """A sub-agent forked from this main agent's last answer, with chance
        ``subagent_chance`` (None otherwise, and always for a sub-agent)."""
        if self.is_sub or self.turn == 0 or self.rng.random() >= self.shape.subagent_chance:
            return None
        rng = random.Random(self.rng.getrandbits(64))
        sub = Agent(
            f"{self.name}.sub-{index}",
            self.shape,
            self.scaling,
            rng,
            self.system,
            self.api,
            parent=self.name,
            turns_left=self.shape.subagent_turns,
            messages=list(self.messages),
            counts=list(self.counts),
            covered=self.covered,
        )
        n = self.scaling.tokens(self.shape.subtask_tokens)
        sub._add("user", words(rng, n), n)
        # the sub-agent's first prompt (sent at once) holds this whole conversation and the next
        # message's header: the parent's next turn can reuse that much
        self.covered = max(self.covered, sum(self.counts) + header_tokens("user"))
        return sub

    def think_seconds(self) -> float:
        """Simulated seconds before the next turn (lognormal around ``think_median_s``)."""
        return self.rng.lognormvariate(math.log(self.shape.think_median_s), self.shape.think_sigma)

    def _output(self) -> int:
        s, sc = self.shape, self.scaling
        return lognormal(
            self.rng, sc.tokens(s.output_median), s.output_sigma, 1, sc.tokens(s.output_max)
        )

    def _start_fresh(self) -> None:
        """The conversation is the harness prompt alone; what other agents share with the next
        prompt is that message and the next message's header."""
        self.messages = [self.system]
        self.counts = [message_tokens("system", _words(self.system))]
        self.covered = self.counts[0] + header_tokens("user")

    def _add(self, role: str, content: str, n_words: int) -> None:
        self.messages.append({"role": role, "content": content})
        self.counts.append(message_tokens(role, n_words))


def _words(message: Message) -> int:
    return len(message["content"]) // 4


def harness_prompt(shape: AgentShape, scaling: Scaling, seed: int) -> Message:
    """The system prompt every agent shares."""
    rng = random.Random(seed * 7_919 + 3)
    return {"role": "system", "content": words(rng, scaling.tokens(shape.system_tokens))}
