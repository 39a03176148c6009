"""Polar as a NeMo Gym agent server, so NeMo RL drives Polar's rollouts through the interface it already calls.

NeMo RL posts each dataset row to an agent's ``POST /run`` and trains on the answer: the row echoed, a Responses-API
``response`` whose output items carry each model call's ``prompt_token_ids`` / ``generation_token_ids`` /
``generation_log_probs``, and a ``reward``. Here a row becomes one Polar session (``rows``: a template maps it onto
a task), which runs through the normal pipeline (queued, retried on infrastructure faults, captured, scored); the
settled session becomes the answer (``answers``). ``waiter`` tells thousands of waiting rows when their sessions
settle with one query, and ``server`` is the aiohttp app (``polar gym-agent``): a waiting row holds a coroutine,
never a thread.
"""
