"""``epp bench soak``: mixed load over minutes, and the EPP's memory and bounded maps over time."""
