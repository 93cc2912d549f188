"""Repairs specwatch can make itself (each reads the probes' findings and re-runs them)."""
