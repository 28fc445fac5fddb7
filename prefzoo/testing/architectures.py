"""Architecture sweep: prefzoo's log-probs against each transformers causal LM's own ``forward(...).logits``.

Each model type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` is built from its config class with every size field
shrunk (hidden 32, 2 layers, 4 heads, vocabulary 96, sliding window 4, 4 experts), float32, random weights, eval mode.
Three pairs (prompts of 6-10 tokens, completions of 3-9, longer than the window) go through
:func:`prefzoo.model.logps.sequence_logps` fused, chunked, token-level and with entropies, and through the
shared-prompt layout, and are compared with ``log_softmax`` of the model's own logits on the plain rows.

``python -m prefzoo.testing.architectures [TYPE ...]`` prints one line per architecture and the counts (the
numbers in docs/architectures.md).  Needs the [train] extra (transformers).
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from prefzoo._thirdparty import attn_implementation, supports_sdpa

__all__ = ["FAST_SUBSET", "UNPADDED", "ArchResult", "build_tiny", "causal_lm_types", "check_architecture", "tiny_pairs"]

# the unit-env subset: every logit transform, sliding windows (uniform and alternating), MoE routers, classics
FAST_SUBSET = (
    "llama",
    "qwen2",
    "mistral",
    "gemma",
    "gemma2",
    "gemma3_text",
    "cohere",
    "cohere2",
    "granite",
    "granitemoe",
    "phi3",
    "olmo2",
    "gpt2",
    "gpt_neox",
    "mixtral",
    "qwen2_moe",
    "olmoe",
    "starcoder2",
)
TOKEN_TOL = 1e-4  # nats per token, float32
MAX_PARAMS = 2_000_000  # a shrunk model above this kept a size field the shrinker does not know: skipped


class TinyBuildError(ValueError):
    """The config class cannot be shrunk to a tiny model."""


VOCAB, HIDDEN, LAYERS, HEADS, WINDOW = 96, 32, 2, 4, 4

_SIZES: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "n_embd": HIDDEN,
    "d_model": HIDDEN,
    "n_embed": HIDDEN,
    "embed_dim": HIDDEN,
    "intermediate_size": 2 * HIDDEN,
    "ffn_dim": 2 * HIDDEN,
    "n_inner": 2 * HIDDEN,
    "decoder_ffn_dim": 2 * HIDDEN,
    "moe_intermediate_size": HIDDEN,
    "shared_expert_intermediate_size": HIDDEN,
    "num_hidden_layers": LAYERS,
    "n_layer": LAYERS,
    "num_layers": LAYERS,
    "decoder_layers": LAYERS,
    "num_attention_heads": HEADS,
    "n_head": HEADS,
    "num_heads": HEADS,
    "decoder_attention_heads": HEADS,
    "num_key_value_heads": 2,
    "head_dim": HIDDEN // HEADS,
    "max_position_embeddings": 64,
    "n_positions": 64,
    "n_ctx": 64,
    "sliding_window": WINDOW,
    "num_local_experts": 4,
    "num_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 0,
    "mamba_d_state": 8,  # hybrid SSM models: small state, heads and chunks (their reference kernels are slow)
    "mamba_n_heads": 4,
    "mamba_d_head": 8,
    "mamba_d_ssm": 32,
    "mamba_chunk_size": 8,
    "mamba_head_dim": 8,
    "ssm_state_size": 8,
    "chunk_size": 8,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}
_TRANSFORM_VALUES = {  # exaggerate each transform so a missed one shows (models' defaults are close to 1)
    "final_logit_softcapping": 5.0,
    "logit_scale": 0.25,
    "logits_scaling": 4.0,
    "lm_head_multiplier": 0.5,
    "output_multiplier": 0.5,
}
_MULTIMODAL = ("ForConditionalGeneration", "Git", "Fuyu", "Emu3", "Mllama", "Moshi", "Musicgen", "Whisper", "TrOCR")


@dataclass
class ArchResult:
    """One architecture: 'pass' (sharing may be refused, see ``reason``), 'fail' (the fast path differs or cannot
    run: ``caught`` says whether the run-start self-check stops it), or 'skip' (with the reason)."""

    model_type: str
    status: str
    reason: str = ""
    errors: dict[str, float] = field(default_factory=dict)  # max |Δ| nats per sequence (per token for 'token')
    transform: str = ""
    layer_types: str = ""
    caught: bool = False  # for 'fail' / 'refused': the run-start self-check detects it (never silent)


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _mixed_layer_types(types: list[str], n: int) -> list[str]:
    """n layer types keeping the first type and the first different one (so a 2-layer model stays mixed)."""
    other = next((t for t in types if t != types[0]), types[0])
    return ([types[0], other] + [types[0]] * n)[:n]


def tiny_config(model_type: str) -> Any:
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    base = cls()
    settable = [k for k in dir(base) if not isinstance(getattr(cls, k, None), property)]
    kw = {k: v for k, v in _SIZES.items() if k in settable}
    kw.update({k: v for k, v in _TRANSFORM_VALUES.items() if k in settable})
    if "unpadded_vocab_size" in settable:  # Inkling 2: a head over its first rows; Inkling 1: logits cut to them
        kw["unpadded_vocab_size"] = VOCAB - 6
    types = getattr(base, "layer_types", None)
    if getattr(base, "use_sliding_window", None) is False and hasattr(base, "sliding_window"):
        kw["use_sliding_window"] = True  # layer types rebuilt by the config: layer 0 full, layer 1 sliding
        kw["max_window_layers"] = 1
    elif isinstance(types, list) and types and "layer_types" in settable:
        kw["layer_types"] = _mixed_layer_types(types, LAYERS)
    for key in ("num_key_value_heads",):
        if key in kw and getattr(base, key, None) is None:
            del kw[key]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cfg = cls(**kw)
    return cfg  # the attention implementation is chosen where a model is built (from_config(attn_implementation=...))


def build_tiny(model_type: str, seed: int = 0) -> Any:
    """A float32 tiny model of ``model_type`` in eval mode (exceptions propagate: the caller skips)."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(model_type)
    with contextlib.redirect_stdout(io.StringIO()), torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").parameters())
    if n > MAX_PARAMS:
        raise TinyBuildError(f"{n / 1e6:.1f}M parameters after shrinking the known size fields (limit {MAX_PARAMS:,})")
    torch.manual_seed(seed)
    with contextlib.redirect_stdout(io.StringIO()):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():  # random weights of a visible size (some inits are all-zero or tiny)
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    return model.eval()


UNPADDED = ((10, 9, 9), (6, 13, 13), (8, 11, 11))  # every row 19 tokens: no padding (for float64 gradients)


def tiny_pairs(
    vocab: int, seed: int = 0, shapes: tuple[tuple[int, int, int], ...] = ((10, 9, 7), (6, 3, 8), (8, 5, 5))
) -> list[dict[str, Any]]:
    """Pairs of (prompt, chosen, rejected) lengths ``shapes`` (by default longer than the window, padded), token ids
    in [3, vocab) drawn from a generator seeded with ``seed`` (0 by default: the same pairs every run)."""
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    return [
        {"id": f"a{i}", "prompt_ids": ids(p), "chosen_ids": ids(c), "rejected_ids": ids(r)}
        for i, (p, c, r) in enumerate(shapes)
    ]


def _token_range(model: Any) -> int:
    """Token ids the pairs may use: the model's vocabulary, or fewer where its logits cover fewer (a model whose head
    leaves out the padded end of the embedding table, such as Inkling 2, or whose forward cuts its logits to the
    first rows, such as Inkling 1, is never given those ids: they have no probability)."""
    from prefzoo.model import vocab_cut

    head = model.get_output_embeddings()
    rows = getattr(head, "out_features", None) if head is not None else None
    cut = vocab_cut(model.config)
    return min([VOCAB, *(int(n) for n in (rows, cut) if isinstance(n, int))])  # VOCAB alone: min of one


def _model_logits(model: Any, batch: dict[str, Any]) -> torch.Tensor:
    """The model's own float32 logits predicting tokens 1..T-1 of the padded batch: (N, T-1, V)."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    return out.logits.float()[:, :-1]


def _token_logps_from(logits: torch.Tensor, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-sequence sums (N,), per-token log p (N, T-1), entropies (N, T-1)) from the model's own logits."""
    ids, cm = batch["input_ids"], batch["completion_mask"]
    logp_all = torch.log_softmax(logits, -1)
    tok = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (N, T-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)  # (N, T-1)
    m = cm[:, 1:]
    return (tok * m).sum(1), tok, ent


def _compact(x: torch.Tensor, m: torch.Tensor, t_c: int) -> torch.Tensor:
    """(N, T-1) values at completion positions → (N, T_c), left-aligned (the token_logps layout)."""
    out = torch.zeros(x.shape[0], t_c, dtype=x.dtype)
    for i in range(x.shape[0]):
        v = x[i][m[i]]
        out[i, : v.numel()] = v
    return out


def check_architecture(model_type: str, shared: bool = True) -> ArchResult:
    """Build ``model_type`` tiny and compare every prefzoo path with the model's own logits."""
    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.model import attention_layer_types, logit_transform, unwrap

    cls_name = _class_name(model_type)
    if any(s in cls_name for s in _MULTIMODAL):
        return ArchResult(model_type, "skip", f"{cls_name}: needs a vision/audio/encoder input, not a text decoder")
    try:
        model = build_tiny(model_type)
    except ImportError as e:
        return ArchResult(model_type, "skip", f"needs a package: {str(e).splitlines()[0][:100]}")
    except Exception as e:  # any build failure is a skip with its reason
        return ArchResult(
            model_type, "skip", f"cannot be built tiny ({type(e).__name__}: {str(e).splitlines()[0][:90]})"
        )
    cfg = unwrap(model, "base").config
    res = ArchResult(
        model_type,
        "pass",
        transform=logit_transform(cfg).describe(),
        layer_types=",".join(sorted(set(attention_layer_types(cfg)))),
    )
    vocab = _token_range(model)
    plain = PreferenceCollator(0)(tiny_pairs(vocab))
    try:
        with torch.no_grad():
            logits = _model_logits(model, plain)
    except Exception as e:  # only the model's own forward: a bug in the reduction below must not read as a skip
        return ArchResult(model_type, "skip", f"its own forward fails on a padded batch ({type(e).__name__})")
    ref_sum, ref_tok, ref_ent = _token_logps_from(logits, plain)
    _check_fast_paths(model, res, plain, ref_sum, ref_tok, ref_ent)
    if shared and res.status == "pass":
        _check_shared(model, res, ref_sum, vocab)
    if res.status != "pass":  # never silent: the run-start self-check must catch it on the failing layout
        _check_caught(model, res, vocab)
    return res


def _check_fast_paths(
    model: Any,
    res: ArchResult,
    plain: dict[str, Any],
    ref_sum: torch.Tensor,
    ref_tok: torch.Tensor,
    ref_ent: torch.Tensor,
) -> None:
    """The fused and chunked heads' sequence, token log-probs and entropies against the model's own logits."""
    from prefzoo.model import sequence_logps

    ids, attn, cm = plain["input_ids"], plain["attention_mask"], plain["completion_mask"]
    m = cm[:, 1:]
    try:
        with torch.no_grad():
            fused = sequence_logps(model, ids, attn, cm, token_logps=True, token_entropies=True, chunk_size=5)
            chunked = sequence_logps(model, ids, attn, cm, fused_head=False, token_entropies=True, chunk_size=5)
    except Exception as e:  # a fast path that cannot run must be caught by the self-check
        res.status, res.reason = "fail", f"fast path cannot run: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    else:
        t_c = fused.token_logps.shape[1]
        res.errors = {
            "fused": float((fused.logps - ref_sum).abs().max()),
            "chunked": float((chunked.logps - ref_sum).abs().max()),
            "token": float((fused.token_logps - _compact(ref_tok, m, t_c)).abs().max()),
            "entropy": float((fused.token_entropies - _compact(ref_ent, m, t_c)).abs().max()),
            "chunked-entropy": float((chunked.token_entropies - _compact(ref_ent, m, t_c)).abs().max()),
        }
        if max(res.errors.values()) > TOKEN_TOL * 10:
            res.status = "fail"
            res.reason = "fast path differs from the model's logits"


def _check_shared(model: Any, res: ArchResult, ref_sum: torch.Tensor, vocab: int) -> None:
    """The shared-prompt layout against the plain rows, then (if it passes) its split attention; a refusal is noted."""
    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.model import SharedPromptError

    sb = PreferenceCollator(0, share_prompt=True)(tiny_pairs(vocab))
    try:
        _compare_shared(model, res, ref_sum, sb, "shared", "shared-prompt layout")
    except SharedPromptError as e:
        res.reason = f"sharing refused: {str(e).split(': ', 1)[-1][:110]}"
    except Exception as e:
        res.status, res.reason = "fail", f"shared layout crashed: {type(e).__name__}: {str(e)[:80]}"
    else:
        if res.status == "pass":
            _check_split(model, res, ref_sum, sb)


def _check_caught(model: Any, res: ArchResult, vocab: int) -> None:
    """Whether the run-start self-check catches the failure on the failing layout (``res.caught``, in the reason)."""
    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.model import PolicyLogps, check_logps

    share = "shared" in res.reason
    batch = PreferenceCollator(0, share_prompt=share)(tiny_pairs(vocab))
    policy = PolicyLogps(model, chunk_size=5, packing=res.reason.startswith("packed"))  # as a packed run checks
    check = check_logps(policy, batch, rows=3)
    res.caught = not check.ok
    res.reason += "; the self-check catches it" if res.caught else "; THE SELF-CHECK MISSES IT"


def _compare_shared(
    model: Any, res: ArchResult, ref_sum: torch.Tensor, batch: dict[str, Any], key: str, what: str,
    packing: bool = False,
) -> None:  # fmt: skip
    """The shared layout's sequence log-probs (``packing``: from its pairs packed into one row) against the plain
    rows' (``ref_sum``): error ``key``, a failure past the tolerance naming ``what``."""
    from prefzoo.model import sequence_logps

    with torch.no_grad():
        args = (batch["input_ids"], batch["attention_mask"], batch["completion_mask"])
        sh = sequence_logps(model, *args, packing=packing)
    res.errors[key] = float((sh.logps - ref_sum).abs().max())
    if res.errors[key] > TOKEN_TOL * 10:
        res.status, res.reason = "fail", f"{what} differs from the plain rows"


def _check_split(model: Any, res: ArchResult, ref_sum: torch.Tensor, batch: dict[str, Any]) -> None:
    """Under SDPA, the shared layout's attention in two causal parts (fastpath_split) against the plain rows, on
    the padded rows and on the pairs packed into one padding-free row (``packing``, the split gathered from it)."""
    from prefzoo.model import split_refusal, unwrap

    if not supports_sdpa(model):
        return
    old = attn_implementation(model.config)
    try:
        model.set_attn_implementation("sdpa")
    except Exception:  # a model that cannot switch keeps its own attention: nothing to compare
        return
    try:
        causal: Any = unwrap(model, "base")
        if split_refusal(causal.get_decoder(), causal.config) is not None:
            return
        _compare_shared(model, res, ref_sum, batch, "split", "split shared-prompt attention")
        if res.status == "pass":
            _compare_shared(model, res, ref_sum, batch, "packed", "packed shared rows (one row, split)", packing=True)
    except Exception as e:
        res.status, res.reason = "fail", f"split shared-prompt attention crashed: {type(e).__name__}: {str(e)[:80]}"
    finally:
        if res.status == "pass":  # a failure stays under SDPA, for the self-check below to run the split too
            model.set_attn_implementation(old)


def _class_name(model_type: str) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return str(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, ""))


def main(argv: list[str]) -> int:
    """Print one line per architecture (or, with ``--markdown``, the table of docs/architectures.md)."""
    import time
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    markdown = "--markdown" in argv
    types = [a for a in argv if not a.startswith("--")] or causal_lm_types()
    counts: dict[str, int] = {}
    refused = 0
    if markdown:
        print("| model type | result | logit transform | layer types | max error (fused / shared) | notes |")
        print("|---|---|---|---|---|---|")
    for t in types:
        t0 = time.perf_counter()
        r = check_architecture(t)
        counts[r.status] = counts.get(r.status, 0) + 1
        refused += r.reason.startswith("sharing refused")
        if markdown:
            err = " / ".join(f"{r.errors[k]:.0e}" for k in ("fused", "shared") if k in r.errors)
            print(f"| {t} | {r.status} | {r.transform} | {r.layer_types} | {err} | {r.reason} |", flush=True)
        else:
            errs = " ".join(f"{k}={v:.1e}" for k, v in r.errors.items())
            line = f"{t:28s} {r.status:5s} [{r.transform}; {r.layer_types}] {errs} {r.reason}"
            print(f"{line} ({time.perf_counter() - t0:.1f}s)", flush=True)
    print(f"\ncounts: {counts}; prompt sharing refused (with its reason) for {refused} of the passing ones")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
