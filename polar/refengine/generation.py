"""Turning one request into sampled tokens: render, ask the policy, tokenise, apply the stopping rules.

The policy's turn is rendered with the chat template and tokenised in the context of the prompt's last turn,
so the sampled ids are exactly the tokens the next prompt will hold for this turn. max_tokens, stop strings and
stop_token_ids then cut the ids as vLLM's stop checker would, and each kept token gets a deterministic
pseudo-random logprob. Everything here is synchronous and pure given the request's seed.
"""

from __future__ import annotations

import codecs
import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from polar.chat.chat_template import EMPTY_THINK, ChatTemplate, render_assistant_body
from polar.chat.conversation import Message
from polar.chat.errors import ContextLengthError, EngineRequestError
from polar.chat.images import IMAGE_TOKEN, IMAGE_TOKEN_ID, expand_image_ids, load_image, split_placeholders
from polar.chat.prompt_parser import ParsedPrompt, parse_prompt
from polar.chat.tokenizer import IM_END, IM_START, Tokenizer
from polar.refengine.policies import AssistantTurn, ModelSamples, Policy, PolicyRequest, SamplingParams, SeenImage
from polar.refengine.protocol import ChatRequest, CompletionRequest
from polar.refengine.settings import EngineSettings

_LOGPROB_FLOOR = -9999.0
TOP_LOGPROBS_MAX = 20


@dataclass(frozen=True)
class TokenLogprob:
    """Logprob of one sampled token, and the top alternatives (sampled token first) when asked for."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Generation:
    """One finished generation: prompt ids, sampled ids with their text pieces, and why it stopped.

    `pieces[i]` is the text token i adds to `text` (empty for hidden or cut tokens), so `"".join(pieces) == text`.
    """

    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    pieces: tuple[str, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...]
    finish_reason: str
    stop_reason: str | int | None
    delay_s: float = 0.0


@dataclass(frozen=True)
class GenerationInput:
    """What the generator needs, whichever endpoint it came from."""

    prompt_text: str
    prompt_token_ids: tuple[int, ...]
    messages: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str = "auto"
    open_prefix: str = ""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    top_logprobs: int = 0
    images: tuple[SeenImage, ...] = ()  # in the order of their placeholders in the prompt


class Generator:
    """Holds the tokenizer, template and policy of an engine; `generate` serves one request (`agenerate` from
    the server's event loop). A backend that samples with a model (`polar.refengine.torch_generation`) has no
    policy and runs off the event loop."""

    def __init__(
        self, settings: EngineSettings, tokenizer: Tokenizer, template: ChatTemplate, policy: Policy | None
    ) -> None:
        self._settings = settings
        self._tokenizer = tokenizer
        self._template = template
        self._policy = policy
        self._counter = itertools.count()

    @property
    def tokenizer(self) -> Tokenizer:
        """The engine's tokenizer."""
        return self._tokenizer

    @property
    def template(self) -> ChatTemplate:
        """The engine's chat template."""
        return self._template

    def chat_input(self, request: ChatRequest) -> GenerationInput:
        """Render and tokenise a chat request's prompt."""
        prompt = self._template.render(
            request.messages,
            request.tools,
            request.add_generation_prompt,
            request.continue_final_message,
            request.template_kwargs,
        )
        ids, images = self.tokenize_chat(prompt, request.messages)
        messages, open_prefix = request.messages, ""
        if request.continue_final_message:
            messages, open_prefix = messages[:-1], self._template.open_prefix(messages)
        elif prompt.endswith(EMPTY_THINK):
            open_prefix = EMPTY_THINK
        return GenerationInput(
            prompt_text=prompt,
            prompt_token_ids=tuple(expand_image_ids(ids) if images else ids),
            images=images,
            messages=messages,
            tools=request.tools,
            tool_choice=request.tool_choice,
            open_prefix=open_prefix,
            sampling=request.sampling,
            top_logprobs=request.output.top_logprobs,
        )

    def tokenize_chat(self, prompt: str, messages: Sequence[Message]) -> tuple[list[int], tuple[SeenImage, ...]]:
        """The ids of a rendered chat prompt, one image id per image (``expand_image_ids`` gives the engine's
        expanded ids), and the messages' images decoded (a 400 for one that is not an image)."""
        images = tuple(
            SeenImage(index, load_image(part, f"messages[{index}]"))
            for index, message in enumerate(messages)
            for part in message.images
        )
        if not images:
            return self._tokenizer.encode(prompt), ()
        return self._tokenizer.encode_images(prompt, len(images)), images

    def completion_input(self, request: CompletionRequest) -> GenerationInput:
        """Read a completion prompt (text or ids) back into the conversation it renders. Ids may hold the image id
        (a VLM's prompt resent as tokens, or vLLM's in ``polar.refengine.vllm``): its images come without pixels."""
        if isinstance(request.prompt, str):
            prompt, ids = request.prompt, tuple(self._tokenizer.encode(request.prompt))
        else:
            ids = request.prompt
            prompt = self._tokenizer.decode_prompt(ids, images=True)
        parsed = parse_prompt(prompt)
        images: tuple[SeenImage, ...] = ()
        # The text test first: it is cheap, and an agent's token prompt holds tens of thousands of ids. A text prompt
        # writing <image> holds no image id: it stays text.
        if IMAGE_TOKEN in prompt and IMAGE_TOKEN_ID in ids:
            parsed, images = _placeholders(parsed)
        return GenerationInput(
            prompt_text=prompt,
            prompt_token_ids=ids,
            images=images,
            messages=parsed.messages,
            tools=parsed.tools,
            tool_choice="auto" if parsed.tools else "none",
            open_prefix=parsed.open_prefix or "",
            sampling=request.sampling,
            top_logprobs=request.output.top_logprobs,
        )

    def check_length(self, prompt_len: int, max_tokens: int | None) -> int:
        """The effective max_tokens; ContextLengthError when the prompt (plus max_tokens) does not fit."""
        limit = self._settings.max_model_len
        if prompt_len >= limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{prompt_len} input tokens. Please reduce the length of the input messages.",
                param="messages",
            )
        if max_tokens is None:
            return limit - prompt_len
        if prompt_len + max_tokens > limit:
            raise ContextLengthError(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                f"context length is {limit} tokens and your request has {prompt_len} input tokens "
                f"({max_tokens} > {limit} - {prompt_len}).",
                param="max_tokens",
            )
        return max_tokens

    async def agenerate(self, job: GenerationInput) -> Generation:
        """`generate` for the server's event loop: the scripted policy is instant, so it runs in place."""
        return self.generate(job)

    def generate(self, job: GenerationInput) -> Generation:
        """Ask the policy for a turn and sample it as tokens under the request's stopping rules."""
        max_tokens = self.check_length(len(job.prompt_token_ids), job.sampling.max_tokens)
        policy_rng, logprob_rng, top_rng = self._rngs(job.sampling.seed)
        try:
            ids, turn = self._answer(job, policy_rng)
        except ModelSamples as exc:
            raise EngineRequestError(f"{exc}, and the reference engine has no model (serve it with real vLLM)") from exc
        kept, pieces, finish_reason, stop_reason = self._stop(ids, job.sampling, max_tokens)
        logprobs = tuple(self._logprob(i, logprob_rng, top_rng, job.top_logprobs) for i in kept)
        return Generation(
            prompt_token_ids=job.prompt_token_ids,
            token_ids=tuple(kept),
            pieces=tuple(pieces),
            text="".join(pieces),
            logprobs=logprobs,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            delay_s=max(0.0, turn.delay_s),
        )

    def answer_ids(self, job: GenerationInput, always_think: bool = False) -> list[int]:
        """The policy's whole turn for ``job`` as the token ids a model must sample, end of turn included, before
        any stopping rule (what real vLLM is held to: ``polar.refengine.vllm``). ``ModelSamples`` when the policy
        leaves the turn to the model. ``always_think``: a turn without reasoning still opens with an empty think
        block while thinking is on, as Qwen3 writes it (vLLM's ``qwen3`` parser reads everything before
        ``</think>`` as reasoning, so a bare answer would reach the client as reasoning)."""
        return self._answer(job, self._rngs(job.sampling.seed)[0], always_think)[0]

    def _answer(
        self, job: GenerationInput, rng: random.Random, always_think: bool = False
    ) -> tuple[list[int], AssistantTurn]:
        if self._policy is None:
            raise TypeError("this generator has no policy: its backend overrides generate()")
        thinking = not job.open_prefix.startswith(EMPTY_THINK)
        request = PolicyRequest(
            messages=job.messages,
            tools=job.tools,
            tool_choice=job.tool_choice,
            sampling=job.sampling,
            rng=rng,
            thinking=thinking,
            model=self._settings.model,
            images=job.images,
        )
        turn = self._policy.respond(request)
        if always_think and thinking and turn.reasoning is None and not job.open_prefix:
            turn = replace(turn, reasoning="")
        completion = self._completion_text(turn, job, thinking)
        return self._sample_ids(job.prompt_text, completion + IM_END), turn

    def _rngs(self, seed: int | None) -> tuple[random.Random, random.Random, random.Random]:
        # Separate streams so the number of requested top logprobs never changes the text or the logprobs.
        key = f"{self._settings.seed}:{seed}" if seed is not None else f"{self._settings.seed}:n{next(self._counter)}"
        return random.Random(key + ":policy"), random.Random(key + ":logprob"), random.Random(key + ":top")

    @staticmethod
    def _completion_text(turn: AssistantTurn, job: GenerationInput, thinking: bool) -> str:
        calls = () if job.tool_choice == "none" else turn.tool_calls
        reasoning = turn.reasoning if thinking else None
        body = render_assistant_body(reasoning, turn.content, calls)
        # A prefilled turn is continued; a policy that ignored the prefill starts afresh after it.
        return body[len(job.open_prefix) :] if body.startswith(job.open_prefix) else body

    def _sample_ids(self, prompt_text: str, completion: str) -> list[int]:
        """Tokens of `completion` as they appear after the prompt: text before the last special token
        tokenises independently, so encoding the last turn with and without the completion suffices."""
        tail = prompt_text[max(prompt_text.rfind(IM_START), 0) :]
        tail_ids = self._tokenizer.encode(tail)
        full = self._tokenizer.encode(tail + completion)
        if full[: len(tail_ids)] == tail_ids:
            return full[len(tail_ids) :]
        return self._tokenizer.encode(completion)

    def _stop(
        self, ids: Sequence[int], sampling: SamplingParams, max_tokens: int
    ) -> tuple[list[int], list[str], str, str | int | None]:
        """Cut `ids` at EOS, a stop token, a stop string or max_tokens, as vLLM's stop checker does."""
        tok = self._tokenizer
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        kept: list[int] = []
        pieces: list[str] = []
        text = ""
        finish_reason: str = "length"
        stop_reason: str | int | None = None
        for token_id in ids:
            kept.append(token_id)
            if token_id == tok.eos_token_id or token_id in sampling.stop_token_ids:
                pieces.append("")
                finish_reason = "stop"
                stop_reason = None if token_id == tok.eos_token_id else token_id
                break
            hidden = sampling.skip_special_tokens and tok.is_special(token_id)
            piece = "" if hidden else decoder.decode(tok.token_bytes(token_id))
            pieces.append(piece)
            text += piece
            matched = find_stop(text, len(piece), sampling.stop)
            if matched is not None:
                text = text[: text.index(matched, max(0, len(text) - len(piece) - len(matched)))]
                finish_reason, stop_reason = "stop", matched
                break
            if len(kept) >= max_tokens:
                break
        if finish_reason == "length":
            tail = decoder.decode(b"", final=True)
            pieces[-1] += tail
            text += tail
        return kept, _clip(pieces, len(text)), finish_reason, stop_reason

    def _logprob(self, token_id: int, rng: random.Random, top_rng: random.Random, top: int) -> TokenLogprob:
        logprob = max(_LOGPROB_FLOOR, -rng.expovariate(4.0))
        alternatives: list[tuple[int, float]] = []
        if top:
            alternatives.append((token_id, logprob))
            value = logprob
            while len(alternatives) < min(top, TOP_LOGPROBS_MAX):
                other = top_rng.randrange(self._tokenizer.vocab_size)
                if any(other == seen for seen, _ in alternatives):
                    continue
                value = max(_LOGPROB_FLOOR, value - top_rng.expovariate(1.0))
                alternatives.append((other, value))
        return TokenLogprob(token_id, logprob, tuple(alternatives))


def _placeholders(parsed: ParsedPrompt) -> tuple[ParsedPrompt, tuple[SeenImage, ...]]:
    """The conversation with the image placeholders of its text made images without pixels (the model's own turns
    hold none)."""
    messages: list[Message] = []
    images: list[SeenImage] = []
    for index, message in enumerate(parsed.messages):
        if message.role != "assistant":
            text, parts = split_placeholders(message.content)
            message = replace(message, content=text, images=parts)
            images += [SeenImage(index, None) for _ in parts]
        messages.append(message)
    return replace(parsed, messages=tuple(messages)), tuple(images)


def find_stop(text: str, new_chars: int, stops: Sequence[str]) -> str | None:
    """The first stop string (in request order) that the newest characters completed."""
    for stop in stops:
        if stop and stop in text[max(0, len(text) - new_chars - len(stop) + 1) :]:
            return stop
    return None


def _clip(pieces: list[str], length: int) -> list[str]:
    """Trim pieces so they add up to the first `length` characters (a stop string cut the text)."""
    out: list[str] = []
    used = 0
    for piece in pieces:
        keep = piece[: max(0, length - used)]
        out.append(keep)
        used += len(keep)
    return out
