"""Training data out: what a trainer gets from Polar and how it talks back.

- ``feed``: finished sessions' trajectories behind a commit-ordered cursor (``GET /v1/trajectories``).
- ``exports`` / ``export_formats``: a batch as RL or SFT rows, written as JSONL or Parquet.
- ``callbacks``: POSTs to a batch's ``callback_url`` as groups and the batch finish.
- ``engine_control``: pause / resume of model calls while a trainer syncs weights, with policy versions.
"""
