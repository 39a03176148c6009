"""Not imported: this directory goes first on a tiny-VLM vLLM server's ``PYTHONPATH`` for its ``sitecustomize``
(``polar.refengine.vllm.launch``). A package only so that it ships with Polar's wheel."""
