"""``polar.refengine.vllm.vlm``: where the tiny VLM lives, building it once, its chat template, and the server
command that serves it. No model is built and no vLLM runs here (tests/e2e/test_tiny_vlm.py serves it)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from polar.chat.hf_export import chat_template
from polar.chat.images import IMAGE_TOKEN, IMAGE_TOKEN_ID, IMAGE_TOKENS
from polar.chat.tokenizer import VOCAB_SIZE
from polar.fleet.renderers import template_messages
from polar.refengine.vllm.launch import VLM_SITE, VllmServer, server_command, server_env
from polar.refengine.vllm.model import MAX_MODEL_LEN, tiny_model_dir
from polar.refengine.vllm.vlm import (
    IMAGE_SIZE,
    MAX_IMAGES_PER_PROMPT,
    NAME,
    PATCH_SIZE,
    VISION,
    ensure_tiny_vlm,
    tiny_vlm_dir,
    vlm_chat_template,
)
from tests.polar.chat.test_hf_export import CONVERSATIONS, TOOLS

PYTHON, MODEL = Path("/venv/bin/python"), Path("/models/tiny-vlm")
PNG = "data:image/png;base64,iVBORw0KGgo="  # the template never reads the URL


def _fake_python(tmp_path: Path, script: str) -> Path:
    """An 'interpreter' run as ``python -m MODULE SCRATCH --seed N`` (MODULE is ``$2``, SCRATCH ``$3``)."""
    python = tmp_path / "fake-python"
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o755)
    return python


def _render(template: str, messages: list[dict[str, Any]], tools: Any = None, **kwargs: Any) -> str:
    """``template`` as transformers (and so vLLM) renders it."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(template).render(
        messages=messages, tools=tools, add_generation_prompt=True, **kwargs
    )


def _as_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as vLLM hands them to a template of the ``openai`` content format: string content as one text
    part (a tool message's text parts back to a string)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and message["role"] != "tool":
            message = {**message, "content": [{"type": "text", "text": content}]}
        out.append(message)
    return out


def test_the_image_token_follows_the_vocabulary_and_an_image_is_4_tokens() -> None:
    assert IMAGE_TOKEN == "<image>" and IMAGE_TOKEN_ID == VOCAB_SIZE == 8192
    assert (IMAGE_SIZE // PATCH_SIZE) ** 2 == IMAGE_TOKENS == 4  # CLIP's CLS embedding dropped
    assert VISION["image_size"] == IMAGE_SIZE and VISION["patch_size"] == PATCH_SIZE


def test_tiny_vlm_dir_is_stable_per_seed_and_cache_and_not_the_text_models(tmp_path: Path) -> None:
    directory = tiny_vlm_dir(tmp_path, 0)
    assert directory == tiny_vlm_dir(tmp_path) == tiny_vlm_dir(tmp_path, 0)
    assert directory.parent == tmp_path / "models" and re.fullmatch(r"polar-tiny-vlm-[0-9a-f]{12}", directory.name)
    assert tiny_vlm_dir(tmp_path, 1) != directory and tiny_vlm_dir(tmp_path, 1).parent == directory.parent
    assert tiny_vlm_dir(tmp_path / "other", 0).parent == tmp_path / "other" / "models"
    assert directory != tiny_model_dir(tmp_path, 0)
    assert not tmp_path.joinpath("models").exists()  # naming a directory builds nothing


def test_the_digest_covers_the_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import polar.refengine.vllm.vlm as vlm

    before = tiny_vlm_dir(tmp_path)
    monkeypatch.setitem(vlm.VISION, "hidden_size", 128)
    assert tiny_vlm_dir(tmp_path) != before
    monkeypatch.undo()
    monkeypatch.setattr(vlm, "vlm_chat_template", lambda: "{{ messages }}")
    assert tiny_vlm_dir(tmp_path) != before


def test_a_build_runs_the_vlm_builder_and_lands_whole_in_place(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, 'mkdir -p "$3" && echo "$2 $5" > "$3/config.json"')
    directory = ensure_tiny_vlm(python, tmp_path / "cache", 2)
    assert directory == tiny_vlm_dir(tmp_path / "cache", 2)
    assert (directory / "config.json").read_text() == "polar.refengine.vllm.vlm 2\n"
    assert [p.name for p in directory.parent.iterdir() if not p.name.startswith(".")] == [directory.name]
    never_run = _fake_python(tmp_path, "exit 1")
    assert ensure_tiny_vlm(never_run, tmp_path / "cache", 2) == directory  # built once


def test_a_failed_build_names_the_vlm_and_leaves_nothing(tmp_path: Path) -> None:
    from polar.errors import RuntimeFailure

    python = _fake_python(tmp_path, 'mkdir -p "$3"; echo "no torch here" >&2; exit 1')
    with pytest.raises(RuntimeFailure, match="the tiny VLM failed: no torch here"):
        ensure_tiny_vlm(python, tmp_path / "cache", 0)
    assert not tiny_vlm_dir(tmp_path / "cache", 0).exists()


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}, {"strip_earlier_reasoning": True}])
def test_text_renders_as_the_reference_template_renders_it(
    conversation: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any]
) -> None:
    messages = template_messages(conversation)
    reference = _render(chat_template(), messages, tools, **kwargs)
    assert _render(vlm_chat_template(), messages, tools, **kwargs) == reference
    assert _render(vlm_chat_template(), _as_parts(messages), tools, **kwargs) == reference


@pytest.mark.parametrize("image", [{"type": "image"}, {"type": "image_url", "image_url": {"url": PNG}}])
def test_an_image_part_is_one_placeholder_where_it_stands(image: dict[str, Any]) -> None:
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "You see."}]},
        {"role": "user", "content": [{"type": "text", "text": "a "}, image, {"type": "text", "text": " b"}, image]},
    ]
    assert _render(vlm_chat_template(), messages) == (
        "<|im_start|>system\nYou see.<|im_end|>\n"
        "<|im_start|>user\na <image> b<image><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with_tools = _render(vlm_chat_template(), messages, TOOLS)
    assert with_tools.startswith("<|im_start|>system\nYou see.\n\n# Tools") and with_tools.count(IMAGE_TOKEN) == 2


def test_vllm_reads_the_template_as_openai_content() -> None:
    """vLLM's detection (``vllm.renderers.hf._detect_content_format``) calls a template ``openai`` when it loops
    over a message's content, here inside the ``text_of`` macro called with ``m.content``."""
    template = vlm_chat_template()
    assert "{%- for part in content -%}" in template and "text_of(m.content)" in template
    assert "for part in content" not in chat_template()  # the text model's stays ``string``


def test_the_server_command_of_the_tiny_vlm() -> None:
    command = server_command(VllmServer(tiny_vlm=True), PYTHON, MODEL, on_cpu=True)
    assert command[command.index("--served-model-name") + 1] == NAME == "tiny-vlm"
    assert command[command.index("--model") + 1] == str(MODEL)
    assert command[command.index("--max-model-len") + 1] == str(MAX_MODEL_LEN)
    limit = json.loads(command[command.index("--limit-mm-per-prompt") + 1])
    assert limit == {"image": MAX_IMAGES_PER_PROMPT} and MAX_IMAGES_PER_PROMPT >= 8
    assert command[command.index("--chat-template-content-format") + 1] == "openai"
    assert command[command.index("--dtype") + 1] == "float32"
    named = server_command(VllmServer(tiny_vlm=True, served_model_name="eyes"), PYTHON, MODEL, on_cpu=True)
    assert named[named.index("--served-model-name") + 1] == "eyes"
    text = server_command(VllmServer(), PYTHON, MODEL, on_cpu=True)
    assert "--limit-mm-per-prompt" not in text and text[text.index("--served-model-name") + 1] == "polar-reference"


def test_the_tiny_vlm_serves_no_model_directory() -> None:
    with pytest.raises(ValueError, match="not both"):
        VllmServer(tiny_vlm=True, model=MODEL)


def test_the_tiny_vlm_server_imports_its_sitecustomize_first(tmp_path: Path) -> None:
    env = server_env(VllmServer(tiny_vlm=True), on_cpu=True, base={"PYTHONPATH": "/a"}, cache=tmp_path)
    first, *rest = env["PYTHONPATH"].split(os.pathsep)
    assert Path(first) == VLM_SITE and (VLM_SITE / "sitecustomize.py").is_file() and rest[-1] == "/a"
    assert sorted(p.name for p in VLM_SITE.iterdir() if p.suffix == ".py") == ["__init__.py", "sitecustomize.py"]
    text = server_env(VllmServer(), on_cpu=True, base={}, cache=tmp_path)
    assert str(VLM_SITE) not in text["PYTHONPATH"]
