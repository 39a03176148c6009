"""``polar.refengine.vllm.forcing``: the logits processor's sample log follows vLLM's batch bookkeeping, run in the
interpreter that has vLLM with the batch updates its persistent batch makes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from polar.refengine.vllm import read_sample_log
from polar.refengine.vllm.install import require_vllm_python

REPO = Path(__file__).resolve().parents[4]

# Three sequences enter the batch; the first ends (cut by max_tokens, say) and vLLM's condense() moves the last row
# into its place, listing the removal only as that move; the second ends and leaves a trailing hole (a removal);
# the third, now at index 0, is swapped with a new one.
SCRIPT = """
import torch
from types import SimpleNamespace
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
from polar.refengine.vllm.forcing import PolicyForcing

forcing = PolicyForcing(None, torch.device("cpu"), False)
params = SimpleNamespace(extra_args={"polar_route": "r"}, seed=None)
outputs = [[11, 12], [21], [31, 32, 33]]
forcing.update_state(BatchUpdate(3, [], [(i, params, [i + 1], outputs[i]) for i in range(3)], []))
forcing.update_state(BatchUpdate(2, [], [], [(2, 0, MoveDirectionality.UNIDIRECTIONAL)]))
forcing.update_state(BatchUpdate(1, [1], [], []))
forcing.update_state(BatchUpdate(2, [], [(1, params, [4], [41])], [(0, 1, MoveDirectionality.SWAP)]))
forcing.update_state(BatchUpdate(0, [0, 1], [], []))
"""


def test_every_sequence_that_leaves_the_batch_is_logged_once(tmp_path: Path) -> None:
    log = tmp_path / "samples.jsonl"
    env = {"POLAR_VLLM_LOG": str(log), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(require_vllm_python()), "-c", SCRIPT], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    ended = [(r["prompt_token_ids"], r["token_ids"]) for r in read_sample_log(log)]
    # Before the fix, the first sequence (moved over by condense) was never logged.
    assert ended == [([1], [11, 12]), ([2], [21]), ([4], [41]), ([3], [31, 32, 33])]
    assert [r["prompt_token_ids"] for r in read_sample_log(log, "start")] == [[1], [2], [3], [4]]
