"""Harness programs the end-to-end tests run inside sessions (``python`` harness, repo root on PYTHONPATH)."""
