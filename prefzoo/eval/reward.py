"""Reward accuracy of a model on a preference split, scored by any registered loss's implicit rewards.

Uses the trainer's tokenization (:func:`prefzoo.data.tokenize.tokenize_pairs`), collation and chunked log-probs
(:class:`prefzoo.model.logps.PolicyLogps`), so the numbers match the trainer's own epoch-end evaluation.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["reward_accuracy"]


def reward_accuracy(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    loss: Any = "dpo",
    *,
    reference: Any = None,
    batch_size: int = 16,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
) -> dict[str, float]:
    """mean(chosen_reward > rejected_reward) over ``dataset`` (columns id, prompt, chosen, rejected).

    ``loss`` is a :class:`prefzoo.Loss` or a registered name; its ``chosen_rewards``/``rejected_rewards``
    are the scores (e.g. β·log π/π_ref for ``dpo``, length-normalised log π for ``simpo``).  A loss that
    needs a reference model gets ``reference`` (a causal LM), else a ValueError says to pass one.  A tie
    counts as wrong, as in TRL.  Batch-coupled losses (``mmpo``) normalise within each batch of
    ``batch_size`` pairs; that is monotone, so the within-pair comparison does not depend on it.
    Token limits unset are 1800 / 512 fitted to the model's (and reference's) context, as in training; an explicit
    one that does not fit is a ValueError naming both numbers.
    Returns ``reward_accuracy``, ``tie_rate``, ``mean_margin``, ``mean_loss``, ``pairs``, ``dropped``, the token
    limits used and ``context_truncated`` (pairs truncated only because of the context).
    """
    import torch

    from prefzoo import get_loss
    from prefzoo.data.collate import PreferenceCollator
    from prefzoo.data.tokenize import ensure_pad_token, tokenize_pairs
    from prefzoo.model import PolicyLogps, unwrap
    from prefzoo.types import Need

    loss_fn = get_loss(loss) if isinstance(loss, str) else loss
    ref_needed = Need.REFERENCE in loss_fn.needs
    if ref_needed and reference is None:
        raise ValueError(
            f"loss {loss_fn.spec.name!r} scores with a reference model; pass reference=... (CLI: --reference PATH, "
            "default the --baseline), or pick a reference-free loss such as simpo"
        )
    ensure_pad_token(tokenizer)
    limits = _limits(max_prompt_length, max_completion_length, [model, *([reference] if ref_needed else [])], tokenizer)
    enc, stats = tokenize_pairs(
        dataset, tokenizer, limits.max_prompt_length, limits.max_completion_length, requested=limits.requested
    )
    policy = PolicyLogps(unwrap(model))
    ref = PolicyLogps(unwrap(reference)) if ref_needed else None
    correct, ties, margins, losses = _score(loss_fn, policy, ref, enc, PreferenceCollator(tokenizer.pad_token_id),
                                            batch_size)  # fmt: skip
    acc = torch.cat(correct).float()  # (N,)
    return {
        "reward_accuracy": float(acc.mean()),
        "tie_rate": float(torch.cat(ties).float().mean()),
        "mean_margin": float(torch.cat(margins).mean()),
        "mean_loss": float(torch.cat(losses).mean()),
        "pairs": float(acc.numel()),
        "dropped": float(stats.dropped),
        "max_prompt_length": float(limits.max_prompt_length),
        "max_completion_length": float(limits.max_completion_length),
        "context_truncated": float(stats.context_truncated),
    }


def _score(
    loss_fn: Any, policy: Any, ref: Any, enc: Any, collate: Any, batch_size: int
) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """(correct, ties, margins, losses) per batch of ``enc``: the trainer's scoring loop
    (:func:`prefzoo.scoring.score_batches`) on this process, the reference in eval mode too.  Pairs with
    a non-finite log-prob, loss or reward are left out (as in the trainer's evaluation)."""
    import torch

    from prefzoo.scoring import FrozenReference, score_batches

    device = next(policy.parameters()).device
    reference = FrozenReference.around(ref) if ref is not None else None
    was = ref.training if ref is not None else False
    if ref is not None:
        ref.eval()

    def batches() -> Any:
        for start in range(0, len(enc), batch_size):
            rows = [enc[i] for i in range(start, min(start + batch_size, len(enc)))]
            yield {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in collate(rows).items()}

    correct, ties, margins, losses = [], [], [], []
    try:
        for _, out, ok in score_batches(loss_fn, policy, reference, batches(), contextlib.nullcontext):
            margin = (out.chosen_rewards - out.rejected_rewards)[ok]  # (B',)
            correct.append(margin > 0)
            ties.append(margin == 0)
            margins.append(margin.float())
            losses.append(out.losses[ok].float())
    finally:
        if ref is not None:
            ref.train(was)
    return correct, ties, margins, losses


def _limits(max_prompt: int | None, max_completion: int | None, models: list[Any], tokenizer: Any) -> Any:
    """The token limits fitted to every scoring model's context (the shorter context wins)."""
    from prefzoo.model import fit_to_context, unwrap

    fitted = [fit_to_context(max_prompt, max_completion, unwrap(m), tokenizer) for m in models]
    return min(fitted, key=lambda f: f.max_prompt_length + f.max_completion_length)
