"""Model-server simulator: a vLLM-compatible HTTP server with an engine model, /metrics and KV
events, many pods per process. Entry points: ``epp_tools.sim.fleet.SimFleet`` (in-process) and
``epp_tools.sim.cli.main`` (``epp sim`` / ``python -m epp_tools.sim``)."""
