"""Generated protocol buffer modules (``proto/generate.py``; do not edit)."""
