"""Local stack: a real Envoy, simulated model servers and the EPP on one machine."""
