"""Command-line clients of the admin gRPC API (``epp explain``, ``epp endpoints``, ``epp state``).
A tool: the service never imports it."""
