"""TRL's GRPOTrainer learning through Polar on a CPU (``python -m examples.trl_cpu.train``)."""
