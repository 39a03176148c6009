"""Gemini ``generateContent`` request bodies as OpenAI chat request fields (the half of ``gemini`` that reads).

    engine_body, options = translate(body)

``contents`` become messages (thought parts → the assistant's ``reasoning``, ``functionCall`` → ``tool_calls``,
``functionResponse`` → a tool message holding the compact JSON of ``response``, ``inlineData`` / ``fileData``
images → chat image parts, a tool result's in a user message after the turn's tool messages),
``functionDeclarations`` become function tools (OpenAPI-subset ``parameters`` turned into lower-case JSON Schema),
``toolConfig`` becomes ``tool_choice`` and ``generationConfig`` the sampling fields. Field names are read in
lowerCamelCase or snake_case, as Google's JSON parser accepts both; a repeated field given as one object is read as
a list of one.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

from polar.errors import ValidationError
from polar.protocols import images
from polar.protocols._base import assistant_message

MAX_OUTPUT_TOKENS = 32768
# Part fields that carry data the engine cannot read (server-side tool traffic).
UNSUPPORTED_PARTS = ("executableCode", "codeExecutionResult", "toolCall", "toolResponse")
IMAGE_PARTS = ("inlineData", "fileData")
_SCHEMA_DROPPED = frozenset({"propertyOrdering", "nullable"})


def field(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]`` under its camelCase or snake_case spelling (None when absent)."""
    value = obj.get(name)
    return value if value is not None else obj.get(re.sub(r"([A-Z])", r"_\1", name).lower())


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.capitalize() for word in rest)


def _as_list(value: Any, where: str) -> list[Any]:
    if isinstance(value, dict):
        return [value]
    if not isinstance(value, list):
        raise ValidationError(f"{where}: must be an array", field=where)
    return value


def _number(config: Mapping[str, Any], name: str, integer: bool = False, signed: bool = False) -> Any:
    value = field(config, name)
    kinds = int if integer else (int, float)
    if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) or (value < 0 and not signed)):
        kind = ("" if signed else "non-negative ") + ("integer" if integer else "number")
        raise ValidationError(f"generationConfig.{name}: must be a {kind}", field=f"generationConfig.{name}")
    return value


def _part_kind(part: Any, where: str) -> str | None:
    """``text``, ``image``, ``functionCall``, ``functionResponse``, or None for a part holding only metadata."""
    if not isinstance(part, dict):
        raise ValidationError(f"{where}: must be an object", field=where)
    for name in UNSUPPORTED_PARTS:
        if field(part, name) is not None:
            raise ValidationError(f"{where}: {name} parts are not supported by this model", field=where)
    if any(field(part, name) is not None for name in IMAGE_PARTS):
        return "image"
    for name in ("functionCall", "functionResponse"):
        if field(part, name) is not None:
            if not isinstance(field(part, name), dict):
                raise ValidationError(f"{where}.{name}: must be an object", field=f"{where}.{name}")
            return name
    if "text" in part and not isinstance(part["text"], str):
        raise ValidationError(f"{where}.text: must be a string", field=f"{where}.text")
    return "text" if "text" in part else None  # thoughtSignature / metadata-only parts carry nothing to render


def _parts(content: Mapping[str, Any], where: str) -> list[tuple[str, dict[str, Any], str]]:
    parts = field(content, "parts")
    if parts is None or parts == []:
        raise ValidationError(f"{where}.parts: required, a non-empty array", field=f"{where}.parts")
    found = []
    for index, part in enumerate(_as_list(parts, f"{where}.parts")):
        kind = _part_kind(part, f"{where}.parts[{index}]")
        if kind is not None:
            found.append((kind, part, f"{where}.parts[{index}]"))
    return found


def _text(texts: list[str]) -> str:
    """A user turn's text parts are separate pieces (vLLM joins text parts with newlines too)."""
    return "\n".join(texts)


def _system(raw: Any) -> dict[str, Any] | None:
    if isinstance(raw, str):
        return {"role": "system", "content": raw}
    if isinstance(raw, list):
        raw = {"parts": raw}
    if not isinstance(raw, dict):
        raise ValidationError("systemInstruction: must be a Content object or a string", field="systemInstruction")
    texts = []
    for kind, part, where in _parts(raw, "systemInstruction"):
        if kind != "text":
            raise ValidationError(f"{where}: a system instruction holds text parts only", field=where)
        texts.append(part["text"])
    return {"role": "system", "content": _text(texts)} if texts else None


class _CallIds:
    """Tool-call ids for the engine: the client's when it sent one, else a deterministic one per position.

    A ``functionResponse`` without a known id answers the first unanswered call of the same name in the latest
    model turn (else its first unanswered call), so every tool message's ``tool_call_id`` names an assistant call.
    """

    def __init__(self) -> None:
        self.known: set[str] = set()
        self.pending: list[tuple[str, str]] = []  # (id, name) of the latest model turn's unanswered calls

    @staticmethod
    def sent(raw: Mapping[str, Any]) -> str | None:
        value = raw.get("id")
        return value if isinstance(value, str) and value else None

    def call(self, raw: Mapping[str, Any], position: str) -> str:
        call_id = self.sent(raw) or f"call_{position}"
        self.known.add(call_id)
        self.pending.append((call_id, raw["name"]))
        return call_id

    def response(self, raw: Mapping[str, Any], position: str) -> str:
        sent = self.sent(raw)
        match = next((p for p in self.pending if p[0] == sent), None) if sent in self.known else None
        if match is None and sent not in self.known and self.pending:
            match = next((p for p in self.pending if p[1] == raw.get("name")), self.pending[0])
        if match is not None:
            self.pending.remove(match)
            return match[0]
        return sent or f"call_{position}"


def _image(part: Mapping[str, Any], where: str, found: images.Found, source: str) -> dict[str, Any]:
    """An ``inlineData`` {mimeType, data} or ``fileData`` {mimeType, fileUri} part (or ``FunctionResponsePart``)
    as a chat image part."""
    for name in IMAGE_PARTS:
        if (value := field(part, name)) is not None and not isinstance(value, dict):
            raise ValidationError(f"{where}.{name}: must be an object", field=f"{where}.{name}")
    if (inline := field(part, "inlineData")) is not None:
        data, mime = inline.get("data"), field(inline, "mimeType")
        chat, image = images.from_base64(data, mime, f"{where}.inlineData.data", source, urlsafe=True)
    else:
        data_file = field(part, "fileData")
        uri, mime = field(data_file, "fileUri"), field(data_file, "mimeType")
        chat, image = images.from_uri(uri, mime, f"{where}.fileData.fileUri", source)
    found.append((chat, image))
    return chat


def _response_images(raw: Mapping[str, Any], where: str, found: images.Found) -> list[dict[str, Any]]:
    """The images of ``functionResponse.parts`` (the API's multimodal function responses)."""
    moved = []
    for index, part in enumerate(_as_list(field(raw, "parts") or [], f"{where}.parts")):
        at = f"{where}.parts[{index}]"
        if not isinstance(part, dict) or all(field(part, name) is None for name in IMAGE_PARTS):
            raise ValidationError(f"{at}: only inlineData and fileData image parts are supported", field=at)
        moved.append(_image(part, at, found, "tool_result"))
    return moved


def _model_message(parts: list[tuple[str, dict[str, Any], str]], ids: _CallIds, index: int) -> dict[str, Any]:
    reasoning: list[str] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    ids.pending = []
    for kind, part, where in parts:
        if kind == "text":  # a model turn's text parts are pieces of one streamed text: joined as they are
            (reasoning if part.get("thought") is True else texts).append(part["text"])
            continue
        if kind == "functionResponse":
            raise ValidationError(f"{where}: functionResponse parts belong in a user turn", field=where)
        if kind == "image":
            raise ValidationError(f"{where}: image parts are only accepted in user turns", field=where)
        raw = field(part, "functionCall")
        if not isinstance(raw.get("name"), str) or not raw["name"]:
            raise ValidationError(f"{where}.functionCall.name: required", field=f"{where}.functionCall.name")
        args = raw.get("args") if raw.get("args") is not None else {}
        if not isinstance(args, dict):
            raise ValidationError(f"{where}.functionCall.args: must be an object", field=f"{where}.functionCall.args")
        call_id = ids.call(raw, f"{index}_{len(calls)}")
        arguments = json.dumps(args, ensure_ascii=False)
        calls.append({"id": call_id, "type": "function", "function": {"name": raw["name"], "arguments": arguments}})
    return assistant_message("".join(texts), "".join(reasoning), calls)


def _user_messages(
    parts: list[tuple[str, dict[str, Any], str]], ids: _CallIds, index: int, found: images.Found
) -> list[dict[str, Any]]:
    """Text and image parts become user messages, each ``functionResponse`` a tool message, in the parts' order.

    In a turn that answers calls, images (in ``functionResponse.parts``, or beside the responses as Gemini CLI
    sends a tool's media) are the tool results': they open the turn's last user message, after its last tool
    message, as the tool messages must follow the assistant's calls with nothing between them."""
    answers = any(kind == "functionResponse" for kind, _, _ in parts)
    messages: list[dict[str, Any]] = []
    pieces: list[str | dict[str, Any]] = []
    moved: list[str | dict[str, Any]] = []
    for position, (kind, part, where) in enumerate(parts):
        if kind == "text":
            pieces.append(part["text"])
            continue
        if kind == "image":
            (moved if answers else pieces).append(_image(part, where, found, "tool_result" if answers else "user"))
            continue
        if kind == "functionCall":
            raise ValidationError(f"{where}: functionCall parts belong in a model turn", field=where)
        if pieces:
            messages.append({"role": "user", "content": images.content(pieces)})
            pieces = []
        raw = field(part, "functionResponse")
        response = raw.get("response") if raw.get("response") is not None else {}
        if not isinstance(response, dict):
            raise ValidationError(f"{where}.functionResponse.response: must be an object", field=where)
        moved += _response_images(raw, f"{where}.functionResponse", found)
        content = json.dumps(response, separators=(",", ":"), ensure_ascii=False)
        messages.append({"role": "tool", "tool_call_id": ids.response(raw, f"{index}_{position}"), "content": content})
    pieces = [*moved, *pieces]
    if pieces:
        messages.append({"role": "user", "content": images.content(pieces)})
    return messages


def messages(contents: Any, system: Any = None, found: images.Found | None = None) -> list[dict[str, Any]]:
    """The chat messages for ``contents`` (roles user/model) after an optional system instruction; ``found``
    collects the images (chat part, image) as they are met."""
    found = [] if found is None else found
    if contents is None or contents == []:
        raise ValidationError("contents: required, a non-empty array of Content objects", field="contents")
    result = [message] if system is not None and (message := _system(system)) else []
    ids = _CallIds()
    for index, content in enumerate(_as_list(contents, "contents")):
        where = f"contents[{index}]"
        if not isinstance(content, dict):
            raise ValidationError(f"{where}: must be a Content object", field=where)
        role = field(content, "role") or "user"
        if role == "model":
            result.append(_model_message(_parts(content, where), ids, index))
        elif role in ("user", "function"):
            result.extend(_user_messages(_parts(content, where), ids, index, found))
        else:
            raise ValidationError(f"{where}.role: must be 'user' or 'model', got {role!r}", field=f"{where}.role")
    if all(message["role"] == "system" for message in result):  # e.g. every Content had empty parts
        raise ValidationError("contents: no Content holds a part to send", field="contents")
    return result


def json_schema(schema: Any) -> Any:
    """Gemini's OpenAPI-subset schema (``"type": "OBJECT"``, ``nullable``) as JSON Schema, recursively."""
    if not isinstance(schema, dict):
        return copy.deepcopy(schema)
    out: dict[str, Any] = {}
    for raw_key, value in schema.items():
        key = _camel(raw_key)
        if key in _SCHEMA_DROPPED or value is None:
            continue
        if key == "type" and isinstance(value, str):
            if value.upper() != "TYPE_UNSPECIFIED":
                out["type"] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = json_schema(value)
        elif key == "anyOf" and isinstance(value, list):
            out[key] = [json_schema(sub) for sub in value]
        else:
            out[key] = copy.deepcopy(value)
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _function(declaration: Any, where: str) -> dict[str, Any]:
    if not isinstance(declaration, dict) or not isinstance(declaration.get("name"), str) or not declaration["name"]:
        raise ValidationError(f"{where}.name: required, a non-empty string", field=f"{where}.name")
    function: dict[str, Any] = {"name": declaration["name"]}
    if isinstance(declaration.get("description"), str):
        function["description"] = declaration["description"]
    openapi, plain = field(declaration, "parameters"), field(declaration, "parametersJsonSchema")
    if openapi is not None and plain is not None:
        raise ValidationError(f"{where}: set parameters or parametersJsonSchema, not both", field=where)
    if openapi is not None or plain is not None:
        if not isinstance(openapi if openapi is not None else plain, dict):
            raise ValidationError(f"{where}.parameters: must be a schema object", field=f"{where}.parameters")
        function["parameters"] = json_schema(openapi) if openapi is not None else copy.deepcopy(plain)
    return {"type": "function", "function": function}


def tools(raw: Any) -> list[dict[str, Any]]:
    """OpenAI function tools for ``tools[].functionDeclarations``; server-side tools are refused (400)."""
    found: list[dict[str, Any]] = []
    for index, tool in enumerate(_as_list(raw, "tools") if raw is not None else []):
        if not isinstance(tool, dict):
            raise ValidationError(f"tools[{index}]: must be a Tool object", field=f"tools[{index}]")
        for key, value in tool.items():
            if value is None:
                continue
            if _camel(key) != "functionDeclarations":
                raise ValidationError(
                    f"tools[{index}].{key}: not supported by this model; only functionDeclarations tools are "
                    "(no server-side tools such as googleSearch or codeExecution)",
                    field=f"tools[{index}].{key}",
                )
            where = f"tools[{index}].functionDeclarations"
            found += [_function(d, f"{where}[{i}]") for i, d in enumerate(_as_list(value, where))]
    return found


def tool_choice(config: Any, names: list[str]) -> str | dict[str, Any] | None:
    """``toolConfig.functionCallingConfig`` as ``tool_choice`` (None: the engine's default, auto)."""
    if config is None:
        return None
    calling = field(config, "functionCallingConfig") if isinstance(config, dict) else None
    if not isinstance(calling, dict):
        return None
    mode = str(field(calling, "mode") or "AUTO").upper()
    allowed = field(calling, "allowedFunctionNames") or []
    if not isinstance(allowed, list) or any(name not in names for name in allowed):
        where = "toolConfig.functionCallingConfig.allowedFunctionNames"
        raise ValidationError(f"{where}: must name declared functions", field=where)
    if mode == "NONE":
        return "none"
    if mode == "ANY":
        if not names:
            raise ValidationError("toolConfig: mode ANY needs function declarations", field="toolConfig")
        return {"type": "function", "function": {"name": allowed[0]}} if len(allowed) == 1 else "required"
    if mode not in ("AUTO", "VALIDATED", "MODE_UNSPECIFIED"):
        where = "toolConfig.functionCallingConfig.mode"
        raise ValidationError(f"{where}: must be AUTO, ANY, NONE or VALIDATED", field=where)
    return None


def sampling(config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Engine sampling fields and rendering options for ``generationConfig``."""
    if config is None:
        return {}, {}
    if not isinstance(config, dict):
        raise ValidationError("generationConfig: must be an object", field="generationConfig")
    out: dict[str, Any] = {}
    for name, target in (("temperature", "temperature"), ("topP", "top_p")):
        if (value := _number(config, name)) is not None:
            out[target] = value
    for name, target in (("presencePenalty", "presence_penalty"), ("frequencyPenalty", "frequency_penalty")):
        if (value := _number(config, name, signed=True)) is not None:
            out[target] = value
    for name, target in (("topK", "top_k"), ("seed", "seed")):
        if (value := _number(config, name, integer=True)) is not None:
            out[target] = value
    if (limit := _number(config, "maxOutputTokens", integer=True)) is not None:
        if limit < 1:
            raise ValidationError("generationConfig.maxOutputTokens: must be at least 1", field="generationConfig")
        out["max_tokens"] = min(limit, MAX_OUTPUT_TOKENS)
    if _number(config, "candidateCount", integer=True) not in (None, 1):
        raise ValidationError("generationConfig.candidateCount: only 1 is supported", field="generationConfig")
    stop = field(config, "stopSequences")
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)):
        raise ValidationError("generationConfig.stopSequences: must be an array of strings", field="generationConfig")
    if stop:
        out["stop"] = list(stop)
    thinking = field(config, "thinkingConfig") or {}
    if not isinstance(thinking, dict):
        raise ValidationError("generationConfig.thinkingConfig: must be an object", field="generationConfig")
    if field(thinking, "thinkingBudget") == 0:
        out["chat_template_kwargs"] = {"enable_thinking": False}
    return out, {"include_thoughts": field(thinking, "includeThoughts") is True}


def translate(body: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(engine chat body without capture fields, rendering options) for a ``generateContent`` body."""
    if not isinstance(body, dict):
        raise ValidationError("request body must be a JSON object")
    found: images.Found = []
    engine_body: dict[str, Any] = {
        "messages": messages(field(body, "contents"), field(body, "systemInstruction"), found)
    }
    declared = tools(field(body, "tools"))
    if declared:
        engine_body["tools"] = declared
    choice = tool_choice(field(body, "toolConfig"), [tool["function"]["name"] for tool in declared])
    if choice is not None:
        engine_body["tool_choice"] = choice
    fields, options = sampling(field(body, "generationConfig"))
    engine_body.update(fields)
    if engine_body["messages"][-1]["role"] == "assistant":  # a trailing model turn is a prefill to continue
        engine_body.update(continue_final_message=True, add_generation_prompt=False)
    options["images"] = images.placed(engine_body["messages"], found)
    return engine_body, options
