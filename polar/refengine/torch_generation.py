"""The torch backend (``polar engine --backend torch``): a real model samples the tokens, with real logprobs.

    generator = TorchGenerator(settings, tokenizer, template, new_model(seed))
    gen = generator.generate(job)          # same Generation as the scripted backend, same routes and bodies
    generator.load(path, "3")              # POST /v1/load_weights: new weights, policy version "3"

Sampling is autoregressive with a KV cache: temperature, top-p, the request's seed (a torch generator per request),
stop at end-of-turn, a stop token or a stop string, then the stop rules of ``Generator._stop`` cut the ids exactly
as for the scripted backend. Logprobs are the raw model's (``log_softmax`` of the logits, before temperature and
top-p), as vLLM reports them by default (``logprobs_mode="raw_logprobs"``); at temperature 1 and top-p 1 they are
the sampling distribution's. With ``logprobs_mode="processed_logprobs"`` they are the distribution each token was
sampled from, as vLLM's (what ``polar.records.logprob_mode`` tells apart). One generation at a time: the engine
calls ``generate`` and ``load`` from one worker thread (``Engine.generate``), so weights never change under a running
generation.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import inspect
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from polar.chat.chat_template import ChatTemplate
from polar.chat.errors import EngineRequestError
from polar.chat.tokenizer import Tokenizer
from polar.refengine.generation import TOP_LOGPROBS_MAX, Generation, GenerationInput, Generator, TokenLogprob, find_stop
from polar.refengine.policies import SamplingParams
from polar.refengine.settings import EngineSettings
from polar.refengine.torch_model import load_weights

if TYPE_CHECKING:
    import torch
    from transformers import Qwen2ForCausalLM


class TorchGenerator(Generator):
    """A ``Generator`` whose turns a torch model samples instead of a scripted policy."""

    def __init__(
        self, settings: EngineSettings, tokenizer: Tokenizer, template: ChatTemplate, model: Qwen2ForCausalLM
    ) -> None:
        super().__init__(settings, tokenizer, template, policy=None)
        self.model = model
        self._lock = threading.Lock()
        self._requests = 0
        # One thread: generations run one after another, off the server's event loop (health checks answer).
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-engine")

    async def agenerate(self, job: GenerationInput) -> Generation:
        return await asyncio.get_running_loop().run_in_executor(self._worker, self.generate, job)

    async def aload(self, path: Path) -> None:
        """`load` after the generations queued before it."""
        await asyncio.get_running_loop().run_in_executor(self._worker, self.load, path)

    def load(self, path: Path) -> None:
        """Replace the weights with a ``save_weights`` file (ValueError when it is not this model's)."""
        with self._lock:
            load_weights(self.model, path)

    def generate(self, job: GenerationInput) -> Generation:
        import torch

        if job.images:
            raise EngineRequestError("The torch backend's model reads text only: it cannot take images")
        max_tokens = self.check_length(len(job.prompt_token_ids), job.sampling.max_tokens)
        with self._lock, torch.inference_mode():
            self._requests += 1
            # The request's seed, else one per request (reproducible from the engine's --seed and arrival order).
            seed = job.sampling.seed if job.sampling.seed is not None else self._settings.seed * 7919 + self._requests
            rng = torch.Generator().manual_seed(seed)
            ids, logprobs = self._sample(list(job.prompt_token_ids), job.sampling, max_tokens, rng, job.top_logprobs)
        kept, pieces, finish_reason, stop_reason = self._stop(ids, job.sampling, max_tokens)
        return Generation(
            prompt_token_ids=job.prompt_token_ids,
            token_ids=tuple(kept),
            pieces=tuple(pieces),
            text="".join(pieces),
            logprobs=tuple(logprobs[: len(kept)]),
            finish_reason=finish_reason,
            stop_reason=stop_reason,
        )

    def _sample(
        self, prompt: list[int], sampling: SamplingParams, max_tokens: int, rng: torch.Generator, top: int
    ) -> tuple[list[int], list[TokenLogprob]]:
        import torch

        tok = self._tokenizer
        stops = {tok.eos_token_id, *sampling.stop_token_ids}
        ids: list[int] = []
        logprobs: list[TokenLogprob] = []
        # The text so far, as Generator._stop will read it (hidden special tokens add nothing), to see a stop
        # string the moment a token completes it.
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text = ""
        step_input = torch.tensor([prompt], dtype=torch.long)
        cache_arg = _cache_argument(type(self.model))
        past = None
        for _ in range(max_tokens):
            out = self.model(input_ids=step_input, use_cache=True, **{cache_arg: past})
            past = out.get(cache_arg)
            logits = out.logits[0, -1].float()
            raw = torch.log_softmax(logits, dim=-1)
            token = _pick(logits, sampling, rng)
            if self._settings.logprobs_mode == "processed_logprobs" and sampling.temperature > 0:
                raw = _processed(logits, sampling)
            alternatives: tuple[tuple[int, float], ...] = ()
            if top:
                best = torch.topk(raw, min(top, TOP_LOGPROBS_MAX))
                others = [(int(i), float(v)) for v, i in zip(best.values, best.indices, strict=True) if int(i) != token]
                alternatives = ((token, float(raw[token])), *others[: min(top, TOP_LOGPROBS_MAX) - 1])
            ids.append(token)
            logprobs.append(TokenLogprob(token, float(raw[token]), alternatives))
            if token in stops:
                break
            if sampling.stop:
                hidden = sampling.skip_special_tokens and tok.is_special(token)
                piece = "" if hidden else decoder.decode(tok.token_bytes(token))
                text += piece
                if find_stop(text, len(piece), sampling.stop) is not None:
                    break
            step_input = torch.tensor([[token]], dtype=torch.long)
        return ids, logprobs


@functools.cache
def _cache_argument(model_class: type) -> str:
    """The KV cache's name in and out of ``forward``: ``cache`` in transformers 5, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def _processed(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The log of the distribution ``_pick`` samples from; tokens outside the nucleus get vLLM's JSON floor."""
    import torch

    logprobs = torch.log_softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_logprobs, order = torch.sort(logprobs, descending=True)
        outside = torch.cumsum(sorted_logprobs.exp(), dim=-1) - sorted_logprobs.exp() >= sampling.top_p
        kept = torch.full_like(logprobs, float("-inf")).scatter(0, order[~outside], sorted_logprobs[~outside])
        logprobs = torch.log_softmax(kept, dim=-1)
    return logprobs.clamp(min=-9999.0)


def _pick(logits: torch.Tensor, sampling: SamplingParams, rng: torch.Generator) -> int:
    """Sample one id: greedy at temperature 0, else softmax(logits / T) restricted to the top-p nucleus."""
    import torch

    if sampling.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= sampling.top_p
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=rng))
