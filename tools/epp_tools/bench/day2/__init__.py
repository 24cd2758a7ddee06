"""``epp bench day2``: rolling upgrades, a leader crash, a bad config and model-server rollouts
under agentic load."""
