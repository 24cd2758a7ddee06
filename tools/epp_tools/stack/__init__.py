"""The local stack: a real Envoy, ``redis-server``, EPP processes and simulated model servers on
one machine; ``epp stack`` runs them with a workload, and the benchmarks start the same parts."""
