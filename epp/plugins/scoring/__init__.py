"""Scheduling plugins (scorers, filters or both) whose type name, as upstream registers it, has
no ``-scorer`` or ``-filter`` suffix."""
