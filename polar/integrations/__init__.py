"""Trainers others wrote, learning through Polar.

``adapter`` is the trainer-agnostic surface (``PolarRollouts``: submit tasks, take whole groups of settled samples
as prompt / completion ids with logprobs and an environment mask, load new weights between steps); ``trl`` turns
it into TRL's ``GRPOTrainer`` ``rollout_func``. docs/training-data.md sketches verl's agent loop and SkyRL's
generator on the same surface.
"""

from polar.integrations.adapter import Group, PolarRollouts, RolloutError, Sample, split_trajectory

__all__ = ["Group", "PolarRollouts", "RolloutError", "Sample", "split_trajectory"]
