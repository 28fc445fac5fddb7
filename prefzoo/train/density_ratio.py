"""The density-ratio phase of a run (``--density-ratio``): BCO's underlying-distribution matching, as TRL's BCOTrainer.

For a loss that declares ``LossSpec.density_ratio_weights`` (``bco``), at the start of the run:

1. a seeded sample of up to ``--density-ratio-prompts`` desirable and as many undesirable training examples is drawn
   (every process draws the same one; TRL draws ``prompt_sample_size`` with replacement, prefzoo without);
2. their prompts are embedded (:func:`prefzoo.train.prompt_embedding.mean_pooled_hidden_states` of the frozen
   reference model), each process a 1/P share, and the embeddings are gathered from every process;
3. :class:`prefzoo.losses.density_ratio.DensityRatioClassifier` (sklearn's balanced LogisticRegression, in torch) is
   fitted on them; rank 0's fit is broadcast, so every process holds the same classifier.

Then every training and evaluation batch gets ``UnpairedBatch.density_ratio_weights``: 1 for a desirable example,
clamp(P/(1 − P + 1e-8), --min-density-ratio, --max-density-ratio) for an undesirable one, P = P(desirable | its
prompt) (TRL's ``_get_udm_weight``); the loss multiplies each example's loss by it.  The embedding model is frozen, so
a resumed run refits the same classifier from the same sample (TRL pickles it into the checkpoint instead).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from prefzoo.losses.density_ratio import DensityRatioClassifier, udm_weights
from prefzoo.train.config import ConfigError, TrainConfig
from prefzoo.train.logps import inner_policy
from prefzoo.train.prompt_embedding import PromptEmbedding, mean_pooled_hidden_states
from prefzoo.train.reference import AdapterDisabledReference, FrozenReference

__all__ = ["DensityRatioWeights", "check_density_ratio", "fit_density_ratio", "prompt_rows", "reference_embedding"]

_OPTIONS = {"density_ratio_prompts": 1024, "min_density_ratio": 0.5, "max_density_ratio": 10.0}


def check_density_ratio(cfg: TrainConfig, loss: Any) -> None:
    """One-line ConfigErrors for ``--density-ratio`` settings the run cannot serve, before any model loads."""
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
        "online": "--online: there are no labelled examples at the start to fit the classifier on",
        "precompute_ref": "--precompute-ref: the prompts are embedded by the reference model, which it replaces by "
        "a table",
        "fsdp": "--fsdp: the sharded reference is not wired for prompt embeddings yet",
    }
    for key, why in refusals.items():
        if getattr(cfg, key):
            raise ConfigError(f"--density-ratio with {why}; drop one of them")
    if cfg.deepspeed == "zero3":
        raise ConfigError("--density-ratio with --deepspeed zero3: the partitioned reference is not wired for prompt "
                          "embeddings yet; use zero2 or drop --density-ratio")  # fmt: skip


def reference_embedding(reference: Any) -> PromptEmbedding:
    """The default prompt embedding: mean-pooled last hidden states of the frozen reference (no second model)."""
    if isinstance(reference, FrozenReference):
        return mean_pooled_hidden_states(reference.module.lm)
    if isinstance(reference, AdapterDisabledReference):
        inner = inner_policy(reference.policy)
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


class DensityRatioWeights:
    """``weights(batch) -> (N,)`` float32 density-ratio weights of a collated unpaired batch (no grad)."""

    def __init__(self, embed: PromptEmbedding, classifier: DensityRatioClassifier, lo: float, hi: float) -> None:
        self.embed, self.classifier, self.lo, self.hi = embed, classifier, lo, hi

    @torch.no_grad()
    def __call__(self, batch: dict[str, Any]) -> Tensor:
        labels = batch["labels"]  # (N,) bool
        prob = self.classifier.prob_desirable(self.embed(*prompt_rows(batch)))  # (N,) float64
        return udm_weights(prob, labels.to(prob.device), self.lo, self.hi).to(labels.device, torch.float32)


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
    cfg: TrainConfig,
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
    g = torch.Generator().manual_seed(cfg.seed)
    rank, world = accelerator.process_index, accelerator.num_processes
    sides = []
    for want in (True, False):
        idx = torch.nonzero(labels == want)[:, 0]
        idx = idx[torch.randperm(len(idx), generator=g)][: cfg.density_ratio_prompts]  # (≤ k,) the same everywhere
        mine = [list(train_tok[int(i)]["prompt_ids"]) for i in idx[rank::world]]
        local = _embed_prompts(embed, mine, pad_token_id, max(cfg.per_device_batch_size, 1), accelerator.device)
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
