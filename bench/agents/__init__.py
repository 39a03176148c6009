"""Harnesses the benchmarks run (``POLAR_PLUGIN_MODULES=bench.agents``)."""
