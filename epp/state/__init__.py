"""Cross-replica state: the sync loop that moves SharedState facts through a syncer."""
