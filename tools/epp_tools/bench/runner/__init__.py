"""The side-by-side benchmark (``epp bench``): the targets under test, the driver that sends a
workload to one, the closed-loop agent load the scenario benchmarks share, the results and the
report."""
