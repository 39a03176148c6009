"""Trajectory reconstruction (DESIGN.md §5): pure functions from captured calls to training sequences."""

from polar.reconstruction import per_request, prefix_merging
from polar.reconstruction.base import CapturedCall, Reconstruction, TrajectoryData

RECONSTRUCTIONS: dict[str, Reconstruction] = {
    "per_request": per_request.reconstruct,
    "prefix_merging": prefix_merging.reconstruct,
}

__all__ = ["RECONSTRUCTIONS", "CapturedCall", "Reconstruction", "TrajectoryData"]
