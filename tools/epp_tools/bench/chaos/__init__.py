"""``epp bench chaos``: pod, EPP and API server faults under load, in numbers."""
