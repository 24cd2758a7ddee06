"""``epp bench scale``: thousands of coding agents against the EPP, and how its cost grows.

Three parts, each writing Markdown, JSON and PNG plots to ``--out`` (``docs/benchmarks/scale``):

* the ramp (``epp bench scale``, ``epp_tools.bench.scale.ramp``): live agents shaped like llm-d's
  agentic study (``epp_tools.bench.scale.agents``, ``epp_tools.bench.scale.shape``: a main agent
  with a long, growing context, sub-agents forking from it, compaction, Responses API follow-ups,
  think time; lengths scaled down by a stated factor, ratios kept) against a simulated fleet of many
  pods in one ``epp sim`` process, each pod with its KV capacity and vLLM's preemption when it
  runs out. Steps of 250, 500, 1,000, 2,000 and 3,000 agents; per step requests and output
  tokens per simulated minute, errors, requests shed by flow control, preemptions (the pods'
  ``vllm:num_preemptions_total``), the share of the oracle's achievable reuse, the working set
  against the fleet's KV, the router's and Envoy's cores, CPU per request and RSS, and the
  per-pick p50/p99 of ``llm_d_epp_scheduler_e2e_duration_seconds``. ``--targets`` runs the same
  ramp against round robin or a peer router (``epp_tools.bench.runner.targets``), ``--kv-factor``
  sizes the fleet's KV against the working set (below 1 it cannot hold it);
* the cost growth curves (``epp bench scale growth``, ``epp_tools.bench.scale.growth``), measured in
  process;
* the computed line (``epp bench scale cores``, ``epp_tools.bench.scale.cores``).

``--quick`` runs each part small, in under a minute, for CI.
"""
