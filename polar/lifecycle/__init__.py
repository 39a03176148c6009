"""The session lifecycle (DESIGN.md §2): what a session is, how it moves, and who moves it.

- ``states``: the states, the transitions allowed between them, and how an attempt ended (``Outcome``).
- ``transitions``: every state change as a compare-and-set on the session row plus a ``session_events`` row.
- ``batches``: submitting a batch (tasks become pending sessions) and reading its progress.
- ``admission``: the bounded READY buffer that lets pending sessions into ``init``.
- ``dispatch``: how a session is handed to a stage queue, without knowing Celery; ``outbox``: stage messages
  recorded as due with the state change, sent after it commits.
- ``attempts``: how an attempt ended (task or infrastructure) and the sample's next attempt.
- ``nodes``: the worker nodes, their READY bounds and run slots, and which are lost.
- ``cancel``: stopping a batch.
- ``reconciler``: finding sessions whose stage task vanished and moving them on; ``lost_messages``: telling a
  lost stage message from one waiting its turn.
- ``sessions``: reading sessions, their calls and trajectories; ``groups``: naming GRPO groups.

The stage functions themselves live beside this package, in ``polar.stages``.
"""
