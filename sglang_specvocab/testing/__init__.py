"""Tiny checkpoints and stand-ins for tests and first GPU runs."""
