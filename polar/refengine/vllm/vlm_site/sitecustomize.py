"""Run at start-up by every interpreter of a tiny-VLM vLLM server (``launch`` puts this directory first on its
``PYTHONPATH``; ``polar.refengine.vllm.vlm``).

vLLM 0.32's ``llava.py`` imports ``pixtral.py``, which imports ``_num_image_tokens`` from transformers'
``models.pixtral.image_processing_pixtral``, a module that imports torchvision; torchvision does not import beside
the CPU build's torch (``polar.refengine.vllm.install``), so LLaVA would not load. Where torchvision is missing,
that module name is served instead by one holding only ``_num_image_tokens``, taken from transformers' PIL variant
of the same module. Nothing is imported at start-up: the finder acts when the name is first imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

_NAME = "transformers.models.pixtral.image_processing_pixtral"
_PIL = "transformers.models.pixtral.image_processing_pil_pixtral"


class _PilPixtral(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _NAME or importlib.util.find_spec("torchvision") is not None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module._num_image_tokens = importlib.import_module(_PIL)._num_image_tokens  # type: ignore[attr-defined]


sys.meta_path.insert(0, _PilPixtral())
