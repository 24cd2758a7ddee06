"""Workload generators, the side-by-side benchmark runner (``epp bench``) and the hot-path
micro-benchmark (``epp bench micro``)."""
