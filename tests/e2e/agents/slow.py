"""A harness that makes one model call and then works (sleeps) for a while: a target for worker kills.

It writes its pid to ``$SLOW_AGENT_PID_DIR/<session id>`` so a test can check it was killed. Only a sample's
first attempt is slow: the attempt that follows one lost to the infrastructure finishes at once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from openai import OpenAI


def run(instruction: str) -> int:
    pid_dir = os.environ.get("SLOW_AGENT_PID_DIR")
    if pid_dir:
        Path(pid_dir, os.environ["POLAR_SESSION_ID"]).write_text(str(os.getpid()))
    client = OpenAI(max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": instruction}])
    if os.environ.get("POLAR_ATTEMPT", "1") == "1":
        time.sleep(float(os.environ.get("SLOW_AGENT_SECONDS", "60")))
    return 0
