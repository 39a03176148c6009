"""Task loaders: a dataset file in, a batch body for ``POST /v1/batches`` out.

``rows`` reads JSONL and remembers each row's ``file:line``; ``template`` turns any row into a task through a Jinja2
TaskRequest template; ``swebench`` turns SWE-bench-format instances into docker tasks graded by the ``swebench``
evaluator; ``harbor``
turns Harbor task folders into docker tasks graded by their own verifier; ``batch`` wraps the tasks with the
batch defaults and validates them, naming the row of any mistake.
``polar submit`` and ``polar generate`` call ``load_batch``; Python callers can use the pieces directly.
"""

from polar.loaders.batch import load_batch, make_batch, read_mapping
from polar.loaders.harbor import harbor_task, load_harbor
from polar.loaders.rows import Row, numbered, read_jsonl
from polar.loaders.swebench import DEFAULT_IMAGE_TEMPLATE, swebench_instance, tasks_from_swebench
from polar.loaders.template import compile_template, tasks_from_template

__all__ = [
    "DEFAULT_IMAGE_TEMPLATE",
    "Row",
    "compile_template",
    "harbor_task",
    "load_batch",
    "load_harbor",
    "make_batch",
    "numbered",
    "read_jsonl",
    "read_mapping",
    "swebench_instance",
    "tasks_from_swebench",
    "tasks_from_template",
]
