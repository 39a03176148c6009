"""The ``oracle`` harness: a Harbor task's reference solution (``solution/solve.sh``) as the agent, which proves
the task solvable (its verifier should then score 1.0) without a model.

    {"name": "oracle", "settings": {"solution": [<bundle of solution/>]}, "env": {<[solution] env>}}

The loader (``polar.loaders.harbor``) fills ``settings.solution`` from the task folder. The files are written to
the session's ``harbor/solution``, copied to ``/solution`` when the image has it (Polar's Harbor images do), and
``bash solve.sh`` runs from there in the task's working directory, as Harbor's oracle agent does. It makes no model
call, so its sessions have no trajectories.
"""

from __future__ import annotations

from typing import ClassVar

import pydantic

from polar.errors import RuntimeFailure
from polar.harbor.bundle import BundleFile, run_from_mount, unpack
from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment

SOLUTION_DIR = "harbor/solution"
_RUN_SOLUTION = run_from_mount("/solution", "solve.sh")


def solution_files(settings: dict[str, object]) -> list[BundleFile]:
    """``settings.solution`` checked: a bundle holding ``solve.sh``; ValueError saying what is wrong."""
    unknown = sorted(set(settings) - {"solution"})
    if unknown:
        raise ValueError(f"unknown settings {unknown} (the oracle takes only 'solution')")
    try:
        files = pydantic.TypeAdapter(list[BundleFile]).validate_python(settings.get("solution") or [])
    except pydantic.ValidationError as exc:
        raise ValueError(f"solution: {exc.errors(include_url=False)[0]['msg']}") from exc
    if not any(entry.path == "solve.sh" for entry in files):
        raise ValueError("solution: holds no solve.sh (a task without solution/solve.sh has no oracle)")
    return files


class OracleHarness:
    name: ClassVar[str] = "oracle"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        try:
            files = solution_files(context.spec.settings)
        except ValueError as exc:
            raise RuntimeFailure(f"harness 'oracle': settings.{exc}") from exc
        solution = unpack(context.session_dir, SOLUTION_DIR, files)
        return HarnessLaunch(["/bin/sh", "-c", _RUN_SOLUTION, "sh", str(solution)], proxy_environment(context))
