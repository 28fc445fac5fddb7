"""Fixtures of the training benchmark: the tiny Llama, the word-level tokenizer, the workloads, the FLOP bound."""

from __future__ import annotations

import os
import platform
import random
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "LORA_RANK",
    "WORKLOADS",
    "ModelShape",
    "Workload",
    "batch_shape",
    "build_model_dir",
    "flop_bound",
    "make_pairs",
    "matmul_rate",
    "process_peak_rss_mb",
    "reset_peak_rss",
    "step_peak_rss_mb",
    "step_timer",
]


LORA_RANK = 64  # both sides' LoRA in the benchmark (prefzoo's default --lora-r, the paper's r; α = r)


@dataclass(frozen=True)
class ModelShape:
    """A Llama with real-small-model proportions: 49,152-token tied vocabulary, hidden 192, 6 layers (≈12.1M params)."""

    vocab_size: int = 49152  # SmolLM2's vocabulary: the tied LM head is 78% of the parameters
    hidden_size: int = 192
    intermediate_size: int = 512
    num_hidden_layers: int = 6
    num_attention_heads: int = 3  # head_dim 64
    max_position_embeddings: int = 2048

    @property
    def head_params(self) -> int:
        return self.vocab_size * self.hidden_size  # tied embedding = LM head (V·H)

    @property
    def backbone_params(self) -> int:
        """Parameters applied per token by the decoder layers (attention + MLP matrices, norms ignored)."""
        h, i = self.hidden_size, self.intermediate_size
        return self.num_hidden_layers * (4 * h * h + 3 * h * i)

    def adapter_params(self, rank: int) -> int:
        """Parameters of rank-``rank`` LoRA adapters on every attention and MLP matrix (r·(in + out) each)."""
        h, i = self.hidden_size, self.intermediate_size
        return self.num_hidden_layers * rank * (4 * (h + h) + 3 * (h + i))


TINY_SHAPE = ModelShape(
    vocab_size=1024,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    max_position_embeddings=256,
)  # for the smoke test only


@dataclass(frozen=True)
class Workload:
    """Synthetic preference pairs whose prompt / completion lengths (in tokens = words) are uniform in a range."""

    name: str
    prompt: tuple[int, int]  # (min, max) prompt tokens
    completion: tuple[int, int]  # (min, max) tokens of each completion (eos excluded)


WORKLOADS = {
    "ultrafeedback": Workload("ultrafeedback", prompt=(100, 200), completion=(150, 350)),  # ~150 / ~250
    "orca": Workload("orca", prompt=(450, 750), completion=(80, 220)),  # prompt-heavy: ~600 / ~150
    "tiny": Workload("tiny", prompt=(4, 12), completion=(3, 9)),  # smoke test
}


def _word(i: int) -> str:
    return f"w{i}"


_SPECIALS = ("<pad>", "</s>", "<unk>")


def build_model_dir(path: str | Path, shape: ModelShape = ModelShape(), seed: int = 0) -> Path:
    """Save a random-weight Llama (fixed seed) and a WordLevel tokenizer (N words = N tokens) into ``path``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    from prefzoo.testing import tiny_causal_lm

    path = Path(path)
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return path
    path.mkdir(parents=True, exist_ok=True)
    vocab = {s: i for i, s in enumerate(_SPECIALS)}
    vocab.update({_word(i): i for i in range(len(_SPECIALS), shape.vocab_size)})
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    fast.save_pretrained(path)
    model, _ = tiny_causal_lm(
        fast,
        seed=seed,
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=1,  # the word-level tokenizer has no bos: eos (id 1) stands in, as before
    )
    model.save_pretrained(path)
    return path


def make_pairs(workload: Workload, n: int, vocab_size: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` plain-text pairs; completions start with a space so that TRL's prompt+completion concatenation splits."""
    rng = random.Random(seed)

    def words(lo_hi: tuple[int, int]) -> str:
        return " ".join(_word(rng.randrange(len(_SPECIALS), vocab_size)) for _ in range(rng.randint(*lo_hi)))

    return [
        {
            "id": f"p{k}",
            "prompt": words(workload.prompt),
            "chosen": " " + words(workload.completion),
            "rejected": " " + words(workload.completion),
        }
        for k in range(n)
    ]


def matmul_rate(threads: int, n: int = 1536, reps: int = 5) -> float:
    """Best fp32 GEMM rate (FLOP/s) of ``torch.matmul`` on an n×n problem with ``threads`` threads."""
    import time

    import torch

    torch.set_num_threads(threads)
    a, b, out = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    torch.mm(a, b, out=out)  # warm-up; into one buffer: the GEMM's rate, not the allocator's page faults
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def attended_pairs(pairs: list[dict[str, int]]) -> int:
    """(query, key) pairs causal attention must score over ``pairs``, the prompt once: a prompt of P tokens
    P(P + 1)/2, each completion of C tokens after it C·P + C(C + 1)/2 (it sees the prompt and its own prefix)."""
    total = 0
    for p in pairs:
        x = p["prompt"]
        total += x * (x + 1) // 2 + sum(c * x + c * (c + 1) // 2 for c in (p["chosen"], p["rejected"]))
    return total


def flop_bound(
    shape: ModelShape,
    pairs: list[dict[str, int]],
    reference: str,
    lora: bool = False,
    lora_rank: int = LORA_RANK,
    attention: bool = True,
) -> float:
    """Lower bound on the FLOPs of one step over ``pairs`` (dicts of prompt / chosen / rejected token counts).

    Backbone: forward 2·P·tokens, backward 4·P·tokens (2·P with LoRA: activation gradients only), the prompt counted
    once; LM head only at the completion positions: forward 2·H·V, backward 4·H·V (2·H·V with a frozen head).
    LoRA's adapters (rank r on every attention and MLP matrix, A = r·(in + out) parameters): 4·A·tokens on the
    policy pass, the least any implementation does (u = A·x, which ∂B needs; ∂B = ∂y·uᵀ; ∂u = Bᵀ·∂y; ∂A = ∂u·xᵀ),
    even one that merges B·A into the weights for the forward and the input gradient.
    ``reference``: "forward" (one no-grad forward per step), "none" (reference-free or precomputed: counted apart).
    Attention (``attention``, as the field's model-FLOPs utilisation counts it, PaLM's appendix B, but only the
    causal pairs of :func:`attended_pairs`): per layer and attended pair 2·H for the scores q·k and 2·H for the
    weighted sum of v (H = heads × head dim) in the forward, twice that in the backward (∂q, ∂k from the score
    gradients, ∂v and the probabilities' gradient: 8·H; with LoRA too, as the activation gradients pass through).
    ``attention=False`` is the looser bound used until 2026-11-27, which left attention out.
    """
    tokens = sum(p["prompt"] + p["chosen"] + p["rejected"] for p in pairs)
    completions = sum(p["chosen"] + p["rejected"] for p in pairs)
    p_bb, hv = shape.backbone_params, shape.head_params
    backward = 2 if lora else 4
    flops = (2 + backward) * p_bb * tokens + (2 + backward) * hv * completions
    if lora:
        flops += 4 * shape.adapter_params(lora_rank) * tokens
    if reference == "forward":
        flops += 2 * p_bb * tokens + 2 * hv * completions
    if attention:
        per_pair = shape.num_hidden_layers * shape.hidden_size * (4 + 8 + (4 if reference == "forward" else 0))
        flops += per_pair * attended_pairs(pairs)
    return float(flops)


def shape_dict(shape: ModelShape) -> dict[str, int]:
    return asdict(shape)


def batch_shape(batch: dict[str, Any]) -> list[dict[str, int]]:
    """Prompt / chosen / rejected token counts of each pair of a collated prefzoo batch (either layout)."""
    import torch

    chosen, rejected = batch["chosen_lengths"].tolist(), batch["rejected_lengths"].tolist()
    seg = batch["completion_mask"]
    if seg.dtype == torch.bool:  # 2B rows [x, y]: the prompt is the real tokens outside the completion
        prompts = (batch["attention_mask"].sum(dim=1) - seg.sum(dim=1))[: len(chosen)].tolist()
    else:  # B rows [x, y_w, y_l] of segment ids (1 = prompt)
        prompts = (seg == 1).sum(dim=1).tolist()
    return [{"prompt": x, "chosen": w, "rejected": l} for x, w, l in zip(prompts, chosen, rejected, strict=True)]


_PEAK_RESET: list[bool] = []  # whether this process reset its RSS high-water mark at its first step


def reset_peak_rss() -> None:
    """Reset the process's RSS high-water mark (Linux ``/proc/self/clear_refs`` 5) once, at the first training step,
    so that :func:`step_peak_rss_mb` is the peak of the steps alone, without the set-up before them."""
    if _PEAK_RESET:
        return
    try:
        _SETUP_PEAK_MB.append(_vm_hwm_mb())
        Path("/proc/self/clear_refs").write_text("5")
        _PEAK_RESET.append(True)
    except OSError:
        _PEAK_RESET.append(False)


_SETUP_PEAK_MB: list[float] = []  # the high-water mark just before the reset: imports, loading, set-up


def _vm_hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise OSError("no VmHWM in /proc/self/status")


def step_peak_rss_mb() -> float | None:
    """Peak RSS (MB) since :func:`reset_peak_rss` (``VmHWM``), or None where it could not be reset."""
    return _vm_hwm_mb() if _PEAK_RESET and _PEAK_RESET[0] else None


def process_peak_rss_mb() -> float:
    """Peak RSS (MB) of the whole process: ``ru_maxrss``, or, after a reset, the larger of set-up and steps."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB; reset too by clear_refs
    return max([peak, *_SETUP_PEAK_MB])


def step_timer() -> Any:
    """A prefzoo trainer callback timing each optimizer step (``on_step_begin`` → ``on_step_end``) unmodified.

    ``.starts``/``.ends`` are perf_counter times, ``.batches`` each step's pair shapes (:func:`batch_shape`),
    ``.setup_s`` the setup timings the run reported (e.g. ``reference`` for a precomputed reference).
    """
    import time

    from prefzoo.train import Callback

    class StepTimer(Callback):
        def __init__(self) -> None:
            self.starts: list[float] = []
            self.ends: list[float] = []
            self.batches: list[list[dict[str, int]]] = []
            self.setup_s: dict[str, float] = {}

        def on_train_begin(self, state: Any) -> None:
            self.setup_s = dict(state.timings)

        def on_step_begin(self, state: Any) -> None:
            reset_peak_rss()
            self.batches.append([])
            self.starts.append(time.perf_counter())

        def on_batch(self, state: Any, fields: dict[str, Any]) -> None:
            self.batches[-1] += batch_shape(state.batch)

        def on_step_end(self, state: Any) -> None:
            self.ends.append(time.perf_counter())

        def step_seconds(self) -> list[float]:
            return [e - s for s, e in zip(self.starts, self.ends, strict=False)]

    return StepTimer()


def versions(*packages: str) -> dict[str, str]:
    """Python's and each package's installed version ("-" when not installed), for a benchmark's record."""
    from prefzoo.train.checkpoint.final import versions as installed

    return installed(packages, missing="-")


def machine() -> str:
    """CPU model, logical cores, memory and OS, for a benchmark's record."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    except OSError:
        model = platform.processor() or "?"
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {os.cpu_count()} logical cores, {mem:.0f} GiB, {platform.system()} {platform.release()}"


def replace_block(text: str, begin: str, end: str, table: str) -> str:
    """``text`` with ``table`` between the markers ``begin``/``end`` (a marked block appended when they are absent)."""
    block = f"{begin}\n{table}{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    return text + "\n" + block + "\n"
