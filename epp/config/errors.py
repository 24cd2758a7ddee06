"""The error every configuration problem is reported with."""

from __future__ import annotations


class ConfigError(Exception):
    """The configuration cannot be used; the message says where and why."""
