"""The peer routers ``epp bench`` compares the EPP with, installed from PyPI on first use."""
