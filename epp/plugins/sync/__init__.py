"""Cross-replica syncers: transports that carry routing facts between EPP replicas."""
