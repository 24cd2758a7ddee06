"""``epp bench``: the side-by-side benchmark and the scenario benchmarks, one subpackage each.

* ``workloads``: what is sent (seeded request sets and the fleets they run on);
* ``runner``: the side-by-side run (targets, driver, results, report);
* ``peers``: the peer routers from PyPI;
* ``fleet``: simulated pods as processes; ``kube``: a local Kubernetes API server;
* ``micro`` and ``engines``: the hot path in process, and the HTTP/2 engines side by side;
* ``rate``, ``replicas``, ``chaos``, ``day2``, ``soak``, ``fuzz``, ``scale``: the scenarios of
  ``epp bench <name>``, each run by its ``cli.main``.
"""
