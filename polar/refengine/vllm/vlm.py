"""The tiny vision-language model real vLLM serves for ``polar engine --backend vllm --model tiny-vlm``.

A LLaVA-style network with random weights: a CLIP vision tower (28 px images, 14 px patches: 2 x 2 patches and
a CLS embedding, which ``vision_feature_select_strategy="default"`` drops, so **4 image tokens per image**), a
two-layer projector, and the Qwen2 text network of ``polar.refengine.torch_model.ARCHITECTURE`` over the reference
tokenizer plus one added special token, ``<image>``, id **8192** (one past the reference vocabulary; the text
model's vocabulary is 8193). The image processor is transformers' ``CLIPImageProcessorPil`` (resize the short
side to 28, centre-crop 28 x 28): it needs no torchvision, which does not import beside vLLM's CPU torch. Any image
size gives the same 4 tokens.

The chat template is the reference one (``polar.chat.hf_export``: ChatML, tools, ``<think>``, Hermes tool calls)
reading a message's content as a string or as a list of parts: text parts are joined with nothing between them
(as ``polar.chat.conversation`` flattens them), an image part (``image``, as vLLM hands them over, or
``image_url`` / ``input_image``) renders ``<image>`` where it stands. Because the template loops over the parts,
vLLM's detection calls its content format ``openai`` (parts as dicts, images in place) rather than ``string``
(which would move every image's placeholder to the front of its message); ``launch`` also says so explicitly.
vLLM's processor then expands each ``<image>`` id to 4 ids of 8192 in ``prompt_token_ids``.

It is built once per cache into ``<cache>/models/polar-tiny-vlm-<digest>``, like the tiny text model
(``polar.refengine.vllm.model``), by vLLM's own interpreter:

    python -m polar.refengine.vllm.vlm DIR [--seed N]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from polar.chat.hf_export import chat_template
from polar.chat.images import IMAGE_TOKEN, IMAGE_TOKEN_ID, IMAGE_TOKENS
from polar.refengine.torch_model import ARCHITECTURE
from polar.refengine.vllm.model import MAX_MODEL_LEN, build_main, ensure_built, recipe_dir

NAME = "tiny-vlm"  # what --model names it by, and the name it is served under
IMAGE_SIZE = 28
PATCH_SIZE = 14
MAX_IMAGES_PER_PROMPT = 8
# One head of dimension 64, as the text network (vLLM's CPU attention refuses 16); two layers, as LLaVA takes the
# features of the last but one (vision_feature_layer=-2).
VISION: dict[str, Any] = {
    "model_type": "clip_vision_model",
    "image_size": IMAGE_SIZE,
    "patch_size": PATCH_SIZE,
    "num_channels": 3,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 1,
    "projection_dim": 64,
}
_FORMAT = 2  # bump when what a tiny VLM directory holds changes

# The reference template's content reading, made to take a list of parts.
_TEXT_OF = r"""{%- macro text_of(content) -%}
{%- if content is string -%}{{- content -}}
{%- elif content -%}
{%- for part in content -%}
{%- if part is string -%}{{- part -}}
{%- elif part.type in ('image', 'image_url', 'input_image') -%}{{- '__IMAGE__' -}}
{%- elif part.text is string -%}{{- part.text -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
""".replace("__IMAGE__", IMAGE_TOKEN)
_REWRITES = (
    ("m.content if m.content is string else ''", "text_of(m.content)"),
    ("(messages[0].content or '')", "text_of(messages[0].content)"),
)


def vlm_chat_template() -> str:
    """The reference chat template, reading content parts and rendering an image part as ``<image>``."""
    template = chat_template()
    for old, new in _REWRITES:
        if template.count(old) != 1:
            raise AssertionError(f"the reference chat template changed: {old!r} is not in it once")
        template = template.replace(old, new)
    return _TEXT_OF + template


def tiny_vlm_dir(cache: Path | None = None, seed: int = 0) -> Path:
    """Where the tiny VLM of ``seed`` lives in the cache (it may not be built yet)."""
    from polar.chat.tokenizer import load_tokenizer

    tokenizer = load_tokenizer().to_json()
    recipe = [_FORMAT, ARCHITECTURE, VISION, IMAGE_TOKEN, IMAGE_TOKEN_ID, IMAGE_TOKENS, MAX_MODEL_LEN, seed,
              vlm_chat_template(), tokenizer]  # fmt: skip
    return recipe_dir(cache, "polar-tiny-vlm", recipe)


def ensure_tiny_vlm(python: Path, cache: Path | None = None, seed: int = 0) -> Path:
    """The tiny VLM's directory, built first by ``python`` (an interpreter with torch and transformers) when the
    cache lacks it: under a lock, into a scratch directory renamed into place."""
    return ensure_built(tiny_vlm_dir(cache, seed), python, "polar.refengine.vllm.vlm", seed, cache, "the tiny VLM")


def build(directory: Path, seed: int = 0) -> Path:
    """Write the tokenizer (with ``<image>``), chat template, image processor, config and random weights of the
    tiny VLM to ``directory``."""
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import AddedToken, Tokenizer
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen2Config
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from polar.chat.hf_export import export_tokenizer
    from polar.chat.tokenizer import ENDOFTEXT, load_tokenizer

    export_tokenizer(directory, NAME)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(IMAGE_TOKEN, special=True, normalized=False)])
    if tokenizer.token_to_id(IMAGE_TOKEN) != IMAGE_TOKEN_ID:
        raise AssertionError(f"{IMAGE_TOKEN} got id {tokenizer.token_to_id(IMAGE_TOKEN)}, not {IMAGE_TOKEN_ID}")
    tokenizer.save(str(directory / "tokenizer.json"))
    config_path = directory / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text(encoding="utf-8"))
    tokenizer_config.update(chat_template=vlm_chat_template(), extra_special_tokens={"image_token": IMAGE_TOKEN})
    config_path.write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False), encoding="utf-8")

    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    image_processor.save_pretrained(directory)
    processor_config = {
        "processor_class": "LlavaProcessor",
        "image_token": IMAGE_TOKEN,
        "patch_size": PATCH_SIZE,
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,  # CLIP's CLS embedding
    }
    (directory / "processor_config.json").write_text(json.dumps(processor_config, indent=2), encoding="utf-8")

    reference = load_tokenizer()
    text_config = Qwen2Config(
        vocab_size=IMAGE_TOKEN_ID + 1,
        bos_token_id=reference.token_to_id(ENDOFTEXT),
        eos_token_id=reference.eos_token_id,
        pad_token_id=reference.token_to_id(ENDOFTEXT),
        **{**ARCHITECTURE, "max_position_embeddings": MAX_MODEL_LEN},
    )
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(**{k: v for k, v in VISION.items() if k != "model_type"}),
        text_config=text_config,
        image_token_index=IMAGE_TOKEN_ID,
        image_seq_length=IMAGE_TOKENS,  # (IMAGE_SIZE // PATCH_SIZE) ** 2: no CLS
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        tie_word_embeddings=False,
        eos_token_id=reference.eos_token_id,
        pad_token_id=reference.token_to_id(ENDOFTEXT),
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    model.eval()
    model.save_pretrained(directory)
    # transformers 5 writes the CLIP tower as ``vision_tower.*``; vLLM 0.32 (and transformers, which reads both)
    # wants the hub's ``vision_tower.vision_model.*``.
    weights = directory / "model.safetensors"
    state = load_file(str(weights))
    tower = "vision_tower."
    renamed = {tower + "vision_model." + k[len(tower) :] if k.startswith(tower) else k: v for k, v in state.items()}
    save_file(renamed, str(weights), metadata={"format": "pt"})
    return directory


def main() -> None:
    build_main(build, "Build the tiny VLM real vLLM serves (polar engine --backend vllm --model tiny-vlm).")


if __name__ == "__main__":
    main()
