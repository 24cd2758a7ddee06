"""Model-server simulator: a vLLM-compatible HTTP server with an engine model, /metrics and KV
events, many pods per process. Entry points: ``epp.sim.fleet.SimFleet`` (in-process) and
``epp.sim.cli.main`` (``epp sim`` / ``python -m epp.sim``)."""
