"""The benchmark's workloads: seeded request sets and the simulated fleets they run on
(``spec``), the catalog ``epp bench --workloads`` names (``catalog``), the generators of the
agentic, overload and KV-pressure workloads, and the oracle's achievable prefix reuse."""
