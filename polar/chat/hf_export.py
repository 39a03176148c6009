"""The reference engine's tokenizer and chat template as a Hugging Face tokenizer directory.

    polar engine --export-tokenizer ./reference-tokenizer        # tokenizer.json + tokenizer_config.json

A real SGLang deployment ships the model's tokenizer directory; Polar's proxy renders SGLang prompts from it
with ``transformers`` (``polar.fleet.renderers``). This export is that directory for the reference engine: the
trained BPE as ``tokenizer.json`` and ``chat_template`` as a Jinja template that writes exactly what
``polar.chat.chat_template.ChatTemplate`` writes (a test renders conversations both ways). Messages reach the
template as vLLM hands them to one: tool-call arguments parsed to objects, reasoning as ``reasoning_content``.
"""

from __future__ import annotations

import json
from pathlib import Path

from polar.chat.chat_template import TOOLS_FOOTER, TOOLS_HEADER
from polar.chat.tokenizer import ENDOFTEXT, IM_END, load_tokenizer

# Mirrors chat_template.py: render_assistant_body, the tools block, grouped tool responses, Qwen3's stripping of
# reasoning before the last user turn, enable_thinking=false's empty think block.
CHAT_TEMPLATE = r"""{%- set strip = strip_earlier_reasoning if strip_earlier_reasoning is defined else __STRIP__ -%}
{%- set ns = namespace(last_user=-1, out='') -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- set msgs = messages -%}
{%- set offset = 0 -%}
{%- if tools -%}
{%- set system = '' -%}
{%- if messages and messages[0].role == 'system' -%}
{%- set system = (messages[0].content or '') ~ '\n\n' -%}{%- set msgs = messages[1:] -%}{%- set offset = 1 -%}
{%- endif -%}
{{- '<|im_start|>system\n' ~ system ~ __HEADER__ -}}
{%- for tool in tools -%}{{- '\n' ~ (tool | tojson) -}}{%- endfor -%}
{{- __FOOTER__ ~ '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in msgs -%}
{%- set previous = msgs[loop.index0 - 1].role if loop.index0 > 0 else none -%}
{%- set following = msgs[loop.index0 + 1].role if loop.index0 + 1 < msgs | length else none -%}
{%- set content = m.content if m.content is string else '' -%}
{%- if m.role == 'tool' -%}
{{- ('<|im_start|>user' if previous != 'tool' else '') ~ '\n<tool_response>\n' ~ content ~ '\n</tool_response>'
    ~ ('<|im_end|>\n' if following != 'tool' else '') -}}
{%- elif m.role == 'assistant' -%}
{%- set reasoning = m.reasoning_content if m.reasoning_content is string else none -%}
{%- if strip and loop.index0 + offset < ns.last_user -%}
{%- set reasoning = none -%}
{%- if '</think>' in content -%}{%- set content = content.split('</think>', 1)[1].lstrip('\n') -%}{%- endif -%}
{%- endif -%}
{%- if reasoning is none and '</think>' in content -%}
{%- set before = content.split('</think>', 1)[0] -%}{%- set content = content.split('</think>', 1)[1] -%}
{%- set reasoning = before.split('<think>', 1)[-1] -%}
{%- endif -%}
{%- set ns.out = '' -%}
{%- if reasoning is not none -%}
{%- set ns.out = '<think>\n' ~ reasoning.strip('\n') ~ '\n</think>\n\n' -%}{%- set content = content.lstrip('\n') -%}
{%- endif -%}
{%- if m.tool_calls -%}{%- set content = content.rstrip('\n') -%}{%- endif -%}
{%- set ns.out = ns.out ~ content -%}
{%- for call in (m.tool_calls or []) -%}
{%- set f = call.function if call.function is defined else call -%}
{%- set args = f.arguments if f.arguments is string else (f.arguments | tojson) -%}
{%- set ns.out = ns.out ~ ('\n' if loop.index0 > 0 or content else '') ~ '<tool_call>\n{"name": ' ~ (f.name | tojson)
    ~ ', "arguments": ' ~ args ~ '}\n</tool_call>' -%}
{%- endfor -%}
{{- '<|im_start|>assistant\n' ~ ns.out ~ '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' ~ m.role ~ '\n' ~ content ~ '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}""".replace("__HEADER__", json.dumps(TOOLS_HEADER)).replace("__FOOTER__", json.dumps(TOOLS_FOOTER))


def chat_template(strip_earlier_reasoning: bool = False) -> str:
    """The Jinja chat template; ``strip_earlier_reasoning`` is its default (a template kwarg overrides it)."""
    return CHAT_TEMPLATE.replace("__STRIP__", "true" if strip_earlier_reasoning else "false")


def export_tokenizer(directory: Path, model: str = "polar-reference", strip_earlier_reasoning: bool = False) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` to ``directory``; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(load_tokenizer().to_json(), encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "name_or_path": model,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 32768,
        "chat_template": chat_template(strip_earlier_reasoning),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return directory
