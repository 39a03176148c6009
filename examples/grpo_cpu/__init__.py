"""GRPO on a CPU through Polar (``make rl-demo``): see ``train.py`` and README.md here."""
