"""Harbor task folders (Harbor's task format: task.toml, instruction.md, environment/, tests/, solution/) as Polar
tasks. ``task_folder`` reads and finds folders; ``images`` builds a folder's environment into a local Docker image,
cached by content hash; ``bundle`` carries ``tests/`` and ``solution/`` inside the request. The pieces that use
them: ``polar.loaders.harbor`` (folder → task), ``polar.evaluators.harbor`` (the verifier, reward read as Harbor
reads it) and ``polar.harnesses.oracle`` (the reference solution as the harness)."""

from polar.harbor.bundle import BundleFile, pack, unpack
from polar.harbor.task_folder import TaskFolder, find_task_folders, read_task_folder

__all__ = ["BundleFile", "TaskFolder", "find_task_folders", "pack", "read_task_folder", "unpack"]
