"""The captured model calls: the one owner of the ``model_calls`` table. Nothing outside ``polar.storage`` names
the table in SQL; it asks these modules.

- ``write``: storing a call on the proxy's hot path (``record_call``, its parents read early with ``read_parents``,
  ``mark_undelivered``); prompts and payloads go in as deltas on earlier calls (``polar.storage.prompts``,
  ``polar.storage.payloads``).
- ``recent``: the calls a proxy process recorded last, so a call's parents come from memory (``RecentCalls``).
- ``read``: calls read back whole (``session_rows``, ``rows_by_session``, ``rebuild``), the column sets callers read,
  and the smaller reads: pages of a session's calls, what postrun judges a session by, a trajectory's call spans,
  the engine a session is pinned to.
- ``exports``: what the training exports read of a batch's calls (answer calls, policy versions, stored rows).
- ``retention``: deleting a batch's calls, or emptying their bodies, for ``polar gc``.
"""
