"""Polar on one machine: the ``polar`` command, the process launcher, embedded mode, the demo, offline SFT
generation and harness checks."""
