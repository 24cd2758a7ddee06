"""``epp bench rate``: per-pick latency and CPU of the EPP at fixed request rates."""
