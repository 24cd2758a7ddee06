"""Kubernetes mode: InferencePool / Pod discovery, InferenceObjective and InferenceModelRewrite
objects (from the cluster or from files), and leader election.

``mode`` builds it from the command-line options; ``source`` runs the watches and publishes
the pool; ``watch`` is the list → watch loop; ``pool``, ``pods``,
``objectives`` and ``rewrites`` decode the objects; ``files`` reads them from YAML files;
``sink`` merges both origins into the request-path stores; ``leader`` runs the Lease election;
``client`` wraps the ``kubernetes`` client (imported only in Kubernetes mode).
"""
