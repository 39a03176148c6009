"""What an operator looks at: read-only views of batches, sessions and trajectories, shaped for people (the web
console, ``web/console``) rather than for trainers (the rollout API's JSON, ``polar.storage.serialization``).

- ``overview``: the batches, newest first, and one batch's progress per task and per node, its reward histograms
  and acceptance rate.
- ``timeline``: a session's ``session_events`` with the time spent in each state.
- ``calls``: a session's captured calls a page at a time, without their token arrays.
- ``trajectory_view``: one trajectory with its call boundaries and merge breaks, cut into pages of tokens.
- ``token_text``: the text of token ids, asked of the engine's ``/detokenize`` (vLLM's protocol) and cached.

Everything here reads; nothing changes a row.
"""

from polar.inspection.calls import call_page, get_call
from polar.inspection.overview import BatchOverview, TaskSummary, batch_overview, histogram, list_batches
from polar.inspection.timeline import Timeline, session_timeline, timeline
from polar.inspection.token_text import Decoded, TokenText
from polar.inspection.trajectory_view import (
    PAGE_TOKENS,
    TrajectoryDetail,
    TrajectoryPage,
    load_trajectory,
    page_window,
    segment_tree,
    trajectory_page,
    trajectory_summaries,
)

__all__ = [
    "PAGE_TOKENS",
    "BatchOverview",
    "Decoded",
    "TaskSummary",
    "Timeline",
    "TokenText",
    "TrajectoryDetail",
    "TrajectoryPage",
    "batch_overview",
    "call_page",
    "get_call",
    "histogram",
    "list_batches",
    "load_trajectory",
    "page_window",
    "segment_tree",
    "session_timeline",
    "timeline",
    "trajectory_page",
    "trajectory_summaries",
]
