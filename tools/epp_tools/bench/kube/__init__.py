"""A local Kubernetes API server for Kubernetes mode: the tests of ``tests/k8s`` and the
``epp bench chaos`` and ``epp bench day2`` scenarios run the EPP against it."""
