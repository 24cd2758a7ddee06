"""``epp bench micro``: the EPP's hot path step by step in this process, the ext_proc wire's
cost per message, and idle CPU."""
