"""Generation engines for on-policy training: n sampled completions per prompt, with their token ids.

One small interface, :class:`GenerationEngine`: ``engine.sample(prompts, params) -> Samples``.  The default,
:class:`HFEngine`, runs ``model.generate`` (KV cache, batched, left-padded, under ``torch.no_grad`` on the unwrapped
policy) through :func:`prefzoo.judge.generation.generate`, so a prompt is rendered exactly as training renders it.
:class:`VLLMEngine` is the field's engine on GPU (TRL's online trainers use it in colocate mode); it needs the
``vllm`` extra and a CUDA device and is refused in one line without them.

Determinism: the same policy, prompts, :class:`SamplingParams` (seed and batch size included) give the same
samples; sample ``j`` of every prompt is drawn in its own generate pass under its own seed, so asking for more
samples never changes the first ones.  On several processes each rank samples its own prompts with a seed that
includes its rank (the caller's job).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from prefzoo.data.chat import Prompt
from prefzoo.errors import install_hint

__all__ = ["ENGINES", "GenerationEngine", "HFEngine", "Samples", "SamplingParams", "VLLMEngine", "make_engine"]


@dataclass(frozen=True)
class SamplingParams:
    """How completions are drawn: ``n`` per prompt, temperature / top-p sampling, at most ``max_new_tokens``."""

    n: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int = 0
    batch_size: int = 64  # prompts per generate call (HF)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"samples_per_prompt={self.n} must be >= 1 (--samples-per-prompt)")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature={self.temperature} must be a positive number (--temperature)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must lie in (0, 1] (--top-p)")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1 (--max-new-tokens)")
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1")


@dataclass
class Samples:
    """``texts[i][j]``: sample j of prompt i (decoded, special tokens dropped); ``token_ids[i][j]`` its new tokens
    before the first eos; ``truncated[i][j]``: it reached max_new_tokens without an eos (scored as it is, counted)."""

    texts: list[list[str]]
    token_ids: list[list[list[int]]]
    truncated: list[list[bool]]
    seconds: float = 0.0  # wall time of the sampling

    @property
    def n_tokens(self) -> int:
        return sum(len(t) for row in self.token_ids for t in row)

    @property
    def n_truncated(self) -> int:
        return sum(sum(row) for row in self.truncated)


@runtime_checkable
class GenerationEngine(Protocol):
    """``sample(prompts, params) -> Samples`` with ``len(prompts)`` rows of ``params.n`` samples each."""

    name: str

    def sample(self, prompts: Sequence[Prompt], params: SamplingParams) -> Samples: ...


class HFEngine:
    """``transformers``' ``generate`` on the (unwrapped) policy: the default engine, CPU and GPU."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer

    def sample(self, prompts: Sequence[Prompt], params: SamplingParams) -> Samples:
        import time

        from prefzoo.judge.generation import generate

        t0 = time.perf_counter()
        prompts = list(prompts)
        texts: list[list[str]] = [[] for _ in prompts]
        ids: list[list[list[int]]] = [[] for _ in prompts]
        cut: list[list[bool]] = [[] for _ in prompts]
        for j in range(params.n):  # sample j of every prompt under its own seed: independent of n and batching
            report: dict[str, Any] = {}
            out = generate(
                self.model, self.tokenizer, prompts, max_new_tokens=params.max_new_tokens,
                batch_size=params.batch_size, do_sample=True, temperature=params.temperature, top_p=params.top_p,
                seed=params.seed + 1_000_003 * j, report=report,
            )  # fmt: skip
            for i, text in enumerate(out):
                texts[i].append(text)
                ids[i].append(report["token_ids"][i])
                cut[i].append(report["new_tokens"][i] >= params.max_new_tokens)
        return Samples(texts, ids, cut, seconds=time.perf_counter() - t0)


class VLLMEngine:
    """vLLM in colocate mode (one engine in the training process, weights pushed before each round).

    Needs the ``vllm`` extra and a CUDA device; elsewhere construction is a one-line error.  The policy's
    current weights are loaded into the engine by :meth:`sync_weights` (called by the online phase before sampling).
    """

    name = "vllm"

    def __init__(self, model: Any, tokenizer: Any, *, gpu_memory_utilization: float = 0.3) -> None:
        import importlib.util

        import torch

        if importlib.util.find_spec("vllm") is None:
            raise RuntimeError(f"--engine vllm: vLLM is not installed; {install_hint('vllm')} (GPU only)")
        if not torch.cuda.is_available():
            raise RuntimeError("--engine vllm: vLLM needs a CUDA device; use --engine hf on this machine")
        from vllm import LLM  # pragma: no cover - GPU only

        from prefzoo.model import unwrap  # pragma: no cover

        self.model, self.tokenizer = unwrap(model), tokenizer  # pragma: no cover
        self.llm = LLM(  # pragma: no cover
            model=self.model.config.name_or_path, tokenizer=getattr(tokenizer, "name_or_path", None),
            gpu_memory_utilization=gpu_memory_utilization, dtype=str(self.model.dtype).removeprefix("torch."),
            enable_prefix_caching=True, seed=0,
        )  # fmt: skip

    def sync_weights(self) -> None:  # pragma: no cover - GPU only
        """Push the policy's current weights into the engine (TRL's colocate-mode load_weights)."""
        worker_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        worker_model.load_weights(self.model.state_dict().items())
        self.llm.reset_prefix_cache()

    def sample(self, prompts: Sequence[Prompt], params: SamplingParams) -> Samples:  # pragma: no cover - GPU only
        import time

        from vllm import SamplingParams as VSP

        from prefzoo.data.chat import render_prompt

        t0 = time.perf_counter()
        self.sync_weights()
        sp = VSP(n=params.n, temperature=params.temperature, top_p=params.top_p,
                 max_tokens=params.max_new_tokens, seed=params.seed)  # fmt: skip
        rendered = [{"prompt_token_ids": render_prompt(self.tokenizer, p)} for p in prompts]
        outs = self.llm.generate(rendered, sp, use_tqdm=False)
        texts = [[c.text for c in o.outputs] for o in outs]
        ids = [[list(c.token_ids) for c in o.outputs] for o in outs]
        cut = [[c.finish_reason == "length" for c in o.outputs] for o in outs]
        return Samples(texts, ids, cut, seconds=time.perf_counter() - t0)


ENGINES: dict[str, type] = {"hf": HFEngine, "vllm": VLLMEngine}


def make_engine(name: str, model: Any, tokenizer: Any, **kwargs: Any) -> Any:
    """The engine called ``name`` (``hf`` or ``vllm``) over ``model``; an unknown name is a one-line error."""
    if name not in ENGINES:
        raise ValueError(f"--engine {name!r}: unknown generation engine; choose one of {', '.join(ENGINES)}")
    return ENGINES[name](model, tokenizer, **kwargs)
