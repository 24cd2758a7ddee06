"""``epp bench fuzz``: seeded adversarial ext_proc streams against an EPP, and its memory bound."""
