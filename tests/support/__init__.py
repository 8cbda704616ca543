"""Helpers the tests share: scenario generators, stand-in servers and workers, and the
script that drives vLLM's own scheduler. Nothing here is a test, and nothing outside the
tests imports it."""
