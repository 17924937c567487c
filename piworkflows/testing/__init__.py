"""Helpers that ship with the package for tests and the demo (no network, no API key)."""
