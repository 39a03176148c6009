"""``polar engine``: the reference engine, or real vLLM, from the command line."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import click

from polar.config import load_config


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--model", default=None,
              help="The served model name (default polar-reference); with --backend vllm, the model directory "
                   "(default: the tiny local model, built once into the engine cache), or tiny-vlm: the tiny "
                   "vision-language model (built once too, served as tiny-vlm).")  # fmt: skip
@click.option("--served-model-name", default=None, help="The served model name (any backend; wins over --model).")
@click.option("--backend", type=click.Choice(["policy", "torch", "vllm"]), default="policy", show_default=True,
              help="policy: a scripted policy writes the turns; torch: a small seeded Qwen2-style model samples "
                   "them (pip install 'polar[train]'), new weights via POST /v1/load_weights; vllm: real vLLM "
                   "serves the model, held to --policy's answers when one is given (docs/engines.md).")  # fmt: skip
@click.option(
    "--weights",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="With --backend torch: start from these weights (a safetensors file) instead of the seed's.",
)
@click.option(
    "--policy",
    default=None,
    help="Policy name or module:Class (default: scripted; with --backend vllm, none: the model samples).",
)
@click.option("--policy-config", default="{}", help="Policy configuration as JSON.")
@click.option("--strip-earlier-reasoning", is_flag=True, help="Drop <think> of earlier turns, as Qwen3 does.")
@click.option("--max-num-seqs", default=256, show_default=True, type=int)
@click.option("--prefill-rate", default=0.0, show_default=True, type=float, help="Prompt tokens/s (0: instant).")
@click.option("--decode-rate", default=0.0, show_default=True, type=float, help="Sampled tokens/s (0: instant).")
@click.option(
    "--max-model-len",
    default=None,
    type=int,
    help="Context length (default 32768; with --backend vllm, the model's, 131072 for the tiny one).",
)
@click.option("--log", "log_path", default=None, help="Append every served request's token ids to this JSONL file.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--api", type=click.Choice(["vllm", "sglang"]), default="vllm", show_default=True,
              help="Wire protocol: vLLM's OpenAI-compatible API or SGLang's native /generate API.")  # fmt: skip
@click.option("--weight-version", default=None, help="The weight version reported until /update_weight_version.")
@click.option("--logprobs-mode", default="raw_logprobs", show_default=True,
              type=click.Choice(["raw_logprobs", "processed_logprobs"]),
              help="As vLLM's (torch backend): logprobs before or after temperature and top-p.")  # fmt: skip
@click.option("--export-tokenizer", default=None, metavar="DIR",
              help="Write the engine's tokenizer and chat template as a Hugging Face tokenizer directory and exit "
                   "(what Polar's proxy renders SGLang prompts with).")  # fmt: skip
@click.option("--install", is_flag=True,
              help="With --backend vllm: install vLLM (its own virtualenv in the engine cache) and build the tiny "
                   "model if missing, print where they are, and exit.")  # fmt: skip
@click.option("--vllm-args", default=None,
              help='With --backend vllm: more arguments for its server, e.g. "--max-num-seqs 8".')  # fmt: skip
def engine(**options: Any) -> None:
    """Run an engine: the reference engine (vLLM's OpenAI-compatible protocol, or SGLang's native one, on the CPU),
    or real vLLM (--backend vllm)."""
    if options["export_tokenizer"]:
        from polar.chat.hf_export import export_tokenizer

        name = options["served_model_name"] or options["model"] or "polar-reference"
        click.echo(export_tokenizer(Path(options["export_tokenizer"]), name))
        return
    try:
        policy_config = json.loads(options.pop("policy_config"))
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--policy-config") from exc
    if options["backend"] == "vllm":
        _serve_vllm(options, policy_config)
        return
    from polar.refengine import EngineSettings, serve

    settings = EngineSettings(
        host=options["host"],
        port=options["port"],
        model=options["served_model_name"] or options["model"] or "polar-reference",
        backend=options["backend"],
        weights=options["weights"],
        policy=options["policy"] or "scripted",
        policy_config=policy_config,
        plugin_modules=load_config().plugin_modules,
        strip_earlier_reasoning=options["strip_earlier_reasoning"],
        max_num_seqs=options["max_num_seqs"],
        prefill_tokens_per_s=options["prefill_rate"],
        decode_tokens_per_s=options["decode_rate"],
        max_model_len=options["max_model_len"] or 32768,
        log_path=options["log_path"],
        seed=options["seed"],
        api=options["api"],
        weight_version=options["weight_version"],
        logprobs_mode=options["logprobs_mode"],
    )
    serve(settings)


def _serve_vllm(options: dict[str, Any], policy_config: dict[str, Any]) -> None:
    """``polar engine --backend vllm``: exec real vLLM's server (or, with --install, install it and exit)."""
    from polar.errors import PolarError
    from polar.refengine import vllm
    from polar.refengine.vllm.install import install

    try:
        if options["install"]:
            python = install()
            click.echo(f"vLLM {vllm.VLLM_VERSION}: {python}")
            click.echo(f"tiny model: {vllm.ensure_tiny_model(python, seed=options['seed'])}")
            if options["model"] == vllm.TINY_VLM:
                click.echo(f"tiny VLM: {vllm.ensure_tiny_vlm(python, seed=options['seed'])}")
            return
        tiny_vlm = options["model"] == vllm.TINY_VLM
        model = Path(options["model"]) if options["model"] and not tiny_vlm else None
        if model is not None and not (model / "config.json").is_file():
            raise click.BadParameter(f"{model} is not a model directory (no config.json)", param_hint="--model")
        server = vllm.VllmServer(
            host=options["host"], port=options["port"], model=model, tiny_vlm=tiny_vlm,
            served_model_name=options["served_model_name"],
            policy=options["policy"], policy_config=policy_config, plugin_modules=load_config().plugin_modules,
            log_path=options["log_path"], seed=options["seed"], max_model_len=options["max_model_len"],
            extra_args=tuple(shlex.split(options["vllm_args"] or "")),
        )  # fmt: skip
        vllm.serve(server)
    except PolarError as exc:
        raise click.ClickException(str(exc)) from exc
