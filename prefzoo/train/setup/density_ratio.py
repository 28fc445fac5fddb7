"""The density-ratio phase of a run (``--density-ratio``): BCO's underlying-distribution matching, as TRL's BCOTrainer.

For a loss that declares ``LossSpec.density_ratio_weights`` (``bco``), at the start of the run:

1. a seeded sample of up to ``--density-ratio-prompts`` desirable and as many undesirable training examples is drawn
   (every process draws the same one; TRL draws ``prompt_sample_size`` with replacement, prefzoo without);
2. their prompts are embedded (:func:`prefzoo.model.embedding.mean_pooled_hidden_states` of the frozen
   reference model), each process a 1/P share, and the embeddings are gathered from every process;
3. :class:`prefzoo.losses.density_ratio.DensityRatioClassifier` (sklearn's balanced LogisticRegression, in torch) is
   fitted on them; rank 0's fit is broadcast, so every process holds the same classifier.

Then every training and evaluation batch gets ``UnpairedBatch.density_ratio_weights``: 1 for a desirable example,
clamp(P/(1 − P + 1e-8), --min-density-ratio, --max-density-ratio) for an undesirable one, P = P(desirable | its
prompt) (TRL's ``_get_udm_weight``); the loss multiplies each example's loss by it.  The reference is frozen, so an
example's weight never changes: each undesirable prompt is embedded once, alone (no padding, so its weight does not
depend on the batch it came in), and its P is kept by example id for later epochs and evaluation; desirable prompts
are never embedded (their weight is 1).

Checkpoints hold the classifier (``density_ratio.safetensors``: w, b and the settings it was fitted with); a resumed
run loads it instead of refitting, and a checkpoint without one (or fitted with other settings) is a one-line
:class:`~prefzoo.train.checkpoint.save.ResumeError` before any model loads.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from prefzoo.losses.density_ratio import DensityRatioClassifier, udm_weights
from prefzoo.model import PromptEmbedding, mean_pooled_hidden_states, unwrap
from prefzoo.scoring import AdapterDisabledReference, FrozenReference, read_safetensors
from prefzoo.train.checkpoint.save import ResumeError
from prefzoo.train.config import ConfigError
from prefzoo.train.config.sections import LossSection, OptimizationSection

__all__ = [
    "CLASSIFIER_FILE",
    "DensityRatioWeights",
    "check_density_ratio",
    "fit_density_ratio",
    "prompt_rows",
    "read_density_ratio",
    "reference_embedding",
]

_OPTIONS = {"density_ratio_prompts": 1024, "min_density_ratio": 0.5, "max_density_ratio": 10.0}
CLASSIFIER_FILE = "density_ratio.safetensors"  # in each checkpoint folder of a --density-ratio run


def check_density_ratio(cfg: LossSection, loss: Any, online: bool) -> None:
    """One-line ConfigErrors for ``--density-ratio`` settings the run cannot serve (``online``: an on-policy run),
    before any model loads."""
    if not cfg.density_ratio:
        changed = [k for k, v in _OPTIONS.items() if getattr(cfg, k) != v]
        if changed:
            flags = ", ".join("--" + k.replace("_", "-") for k in changed)
            raise ConfigError(f"{flags} set without --density-ratio, where they do nothing: add --density-ratio "
                              "(density_ratio: true in YAML) or drop them")  # fmt: skip
        return
    if not loss.spec.density_ratio_weights:
        from prefzoo.registry import list_losses, loss_spec

        takers = [n for n in list_losses() if getattr(loss_spec(n), "density_ratio_weights", False)]
        raise ConfigError(
            f"--density-ratio: loss {cfg.loss!r} does not take density-ratio weights (LossSpec.density_ratio_weights"
            f"; losses that do: {', '.join(takers) or 'none registered'}); drop --density-ratio"
        )
    refusals = {
        "--online: there are no labelled examples at the start to fit the classifier on": online,
        "--precompute-ref: the prompts are embedded by the reference model, which it replaces by a table": (
            cfg.precompute_ref
        ),
    }
    for why, refused in refusals.items():
        if refused:
            raise ConfigError(f"--density-ratio with {why}; drop one of them")


def reference_embedding(reference: Any) -> PromptEmbedding:
    """The default prompt embedding: mean-pooled last hidden states of the frozen reference (no second model)."""
    if isinstance(reference, FrozenReference):
        return mean_pooled_hidden_states(reference.module.lm)
    if isinstance(reference, AdapterDisabledReference):
        inner = unwrap(reference.policy, "policy")
        lm: Any = inner.lm  # a peft model

        def embed(input_ids: Tensor, attention_mask: Tensor) -> Tensor:
            was_training = inner.training
            inner.eval()
            try:
                with lm.disable_adapter():  # the frozen base model
                    return mean_pooled_hidden_states(lm)(input_ids, attention_mask)
            finally:
                inner.train(was_training)

        return embed
    raise ConfigError(f"--density-ratio needs a reference model to embed prompts with, got {type(reference).__name__}")


def prompt_rows(batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """(input_ids (N, T_x), attention_mask (N, T_x)) of the prompts of collated rows ``[x, y]`` (right-padded): the
    attended tokens before each completion.  A causal model's states there depend on the prompt alone."""
    prompt = batch["attention_mask"].bool() & ~batch["completion_mask"].bool()  # (N, T)
    t = max(int(prompt.sum(1).max()), 1)
    return batch["input_ids"][:, :t], prompt[:, :t].long()


def _settings(cfg: LossSection) -> dict[str, str]:
    """What a saved classifier and its weights depend on besides the model, seed and data (checked by resume)."""
    return {k: repr(getattr(cfg, k)) for k in _OPTIONS}


def _digest(weight: Tensor, bias: Tensor) -> str:
    """sha256 of (w, b) as float64 bytes: a bit-rotted classifier file is refused, never trained with."""
    theta = torch.cat((weight.reshape(-1), bias.reshape(-1))).to(torch.float64).contiguous()
    return hashlib.sha256(theta.numpy().tobytes()).hexdigest()


class DensityRatioWeights:
    """``weights(batch) -> (N,)`` float32 density-ratio weights of a collated unpaired batch (no grad).

    An undesirable example's P(desirable | prompt) is computed the first time its id is seen, from its prompt
    embedded alone, and reused after; desirable examples get 1 without an embedding.
    """

    def __init__(self, embed: PromptEmbedding, classifier: DensityRatioClassifier, lo: float, hi: float) -> None:
        self.embed, self.classifier, self.lo, self.hi = embed, classifier, lo, hi
        self.prob: dict[str, float] = {}  # example id -> P(desirable | its prompt), float64 as a Python float

    @torch.no_grad()
    def __call__(self, batch: dict[str, Any]) -> Tensor:
        labels = batch["labels"]  # (N,) bool
        ids = batch["ids"]  # N example ids
        input_ids, prompt = prompt_rows(batch)  # (N, T_x) each
        for i in torch.nonzero(~labels.cpu())[:, 0].tolist():
            if ids[i] not in self.prob:
                x = input_ids[i][prompt[i].bool()].unsqueeze(0)  # (1, |x_i|) the prompt alone, unpadded
                self.prob[ids[i]] = float(self.classifier.prob_desirable(self.embed(x, torch.ones_like(x)))[0])
        prob = torch.tensor([self.prob.get(rid, 1.0) for rid in ids], dtype=torch.float64)  # (N,) 1: desirable
        return udm_weights(prob, labels.cpu(), self.lo, self.hi).to(labels.device, torch.float32)

    def save(self, folder: Path, cfg: LossSection) -> None:
        """The classifier (w, b) and the settings it was fitted with, into checkpoint folder ``folder``."""
        from safetensors.torch import save_file

        state = self.classifier.state_dict()
        meta = {**_settings(cfg), "sha256": _digest(state["weight"], state["bias"])}
        save_file(state, str(Path(folder) / CLASSIFIER_FILE), metadata=meta)


def read_density_ratio(cfg: LossSection, folder: Path | None) -> DensityRatioClassifier | None:
    """The classifier saved in checkpoint ``folder`` when this run resumes one with ``--density-ratio`` (None for a
    fresh start or a run without it); a one-line ResumeError when the checkpoint and the run disagree."""
    if folder is None:
        return None
    path = Path(folder) / CLASSIFIER_FILE
    if not cfg.density_ratio:
        if path.is_file():
            raise ResumeError(f"--resume {folder}: this checkpoint was trained with --density-ratio (it holds "
                              f"{CLASSIFIER_FILE}); add --density-ratio to resume it, or start a new "
                              "--output-dir")  # fmt: skip
        return None
    if not path.is_file():
        raise ResumeError(f"--resume {folder}: this checkpoint holds no density-ratio classifier ({CLASSIFIER_FILE}): "
                          "it was trained without --density-ratio; resume without --density-ratio, or start a new "
                          "--output-dir")  # fmt: skip
    try:
        meta, (weight, bias) = read_safetensors(path, ("weight", "bias"))
    except Exception as e:  # safetensors raises its own error types for a truncated or garbled file
        raise ResumeError(f"--resume {folder}: {CLASSIFIER_FILE} is unreadable ({type(e).__name__}); resume from "
                          "another checkpoint") from None  # fmt: skip
    if (weight.ndim != 1 or bias.ndim != 0 or meta.get("sha256") != _digest(weight, bias)
            or not bool(torch.isfinite(weight).all() and torch.isfinite(bias))):  # fmt: skip
        raise ResumeError(f"--resume {folder}: {CLASSIFIER_FILE} failed its checksum or shape check (w "
                          f"{tuple(weight.shape)}, b {tuple(bias.shape)}); resume from another checkpoint")  # fmt: skip
    saved = {k: meta.get(k) for k in _OPTIONS}
    if saved != _settings(cfg):
        diff = ", ".join(f"{k}={saved[k]} (this run {v})" for k, v in _settings(cfg).items() if saved[k] != v)
        raise ResumeError(f"--resume {folder}: its density-ratio classifier was fitted with {diff}; resume with the "
                          "checkpoint's --density-ratio-prompts / --min-density-ratio / --max-density-ratio, or start "
                          "a new --output-dir")  # fmt: skip
    return DensityRatioClassifier.from_state_dict({"weight": weight, "bias": bias})


def _embed_prompts(embed: PromptEmbedding, prompts: list[list[int]], pad: int, batch: int, device: Any) -> Tensor:
    """(n, D) embeddings of token-id prompts, ``batch`` at a time, right-padded; (0, D) for none."""
    out = []
    for i in range(0, max(len(prompts), 1), batch):
        chunk = prompts[i : i + batch] or prompts[:1] or [[pad]]  # an empty share still learns D (sliced away below)
        t = max(len(p) for p in chunk)
        ids = torch.tensor([p + [pad] * (t - len(p)) for p in chunk], device=device)
        mask = torch.tensor([[1] * len(p) + [0] * (t - len(p)) for p in chunk], device=device)
        out.append(embed(ids, mask).float().cpu())
    e = torch.cat(out)
    return e[: len(prompts)]


def fit_density_ratio(
    cfg: LossSection,
    opt: OptimizationSection,
    reference: Any,
    train_tok: Any,
    pad_token_id: int,
    accelerator: Any,
    gather: Any,
    embed: PromptEmbedding | None = None,
) -> DensityRatioWeights:
    """The classifier of this run, fitted on a seeded sample of the training prompts (the same on every process).

    ``embed``: the prompt embedding (default: :func:`reference_embedding` of ``reference``).
    """
    embed = embed or reference_embedding(reference)
    labels = torch.tensor([bool(v) for v in train_tok["label"]])  # (n,)
    g = torch.Generator().manual_seed(opt.seed)
    rank, world = accelerator.process_index, accelerator.num_processes
    sides = []
    for want in (True, False):
        idx = torch.nonzero(labels == want)[:, 0]
        idx = idx[torch.randperm(len(idx), generator=g)][: cfg.density_ratio_prompts]  # (≤ k,) the same everywhere
        mine = [list(train_tok[int(i)]["prompt_ids"]) for i in idx[rank::world]]
        local = _embed_prompts(embed, mine, pad_token_id, max(opt.per_device_batch_size, 1), accelerator.device)
        sides.append(gather(local.to(accelerator.device)).cpu())  # (≤ k, D) every process's share
    n_d, n_u = sides[0].shape[0], sides[1].shape[0]
    if n_d == 0 or n_u == 0:
        raise ConfigError(f"--density-ratio: the training data holds {n_d} desirable and {n_u} undesirable examples; "
                          "the classifier needs both labels: drop --density-ratio")  # fmt: skip
    clf = DensityRatioClassifier.fit(sides[0], sides[1])
    theta = torch.cat((clf.weight, clf.bias.reshape(1))).to(accelerator.device)  # (D + 1,)
    if world > 1:
        from accelerate.utils import broadcast

        theta = broadcast(theta, from_process=0)  # rank 0's fit on every process, bit for bit
    theta = theta.cpu()
    clf = DensityRatioClassifier(theta[:-1].clone(), theta[-1].clone())
    acc_d = float((clf.prob_desirable(sides[0]) > 0.5).double().mean())
    acc_u = float((clf.prob_desirable(sides[1]) <= 0.5).double().mean())
    accelerator.print(
        f"prefzoo train: density-ratio classifier fitted on {n_d} desirable and {n_u} undesirable prompts "
        f"(mean-pooled hidden states of the reference, D = {sides[0].shape[1]}): training accuracy {acc_d:.3f} "
        f"desirable, {acc_u:.3f} undesirable; undesirable examples weighted by P/(1 − P) clamped to "
        f"[{cfg.min_density_ratio:g}, {cfg.max_density_ratio:g}]"
    )
    return DensityRatioWeights(embed, clf, cfg.min_density_ratio, cfg.max_density_ratio)
