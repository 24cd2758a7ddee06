"""``epp bench replicas``: active-active replicas through a Redis outage and a replica restart,
and ``epp --workers`` against one process."""
