"""TRL's own code for the unpaired losses, copied line for line (only `self.` and the accelerator taken out).

These are the "known good" side of tests/losses/test_unpaired.py; they are written independently of
prefzoo.losses and keep TRL's layout (desirable examples first, then undesirable ones).

* ``kto_trl``: TRL 1.16.0, trl/trainer/kto_trainer.py, ``KTOTrainer._compute_loss`` (the lines from
  ``if self.calculate_KL:`` to ``losses = torch.cat(...)``), for ``loss_type`` "kto" and "apo_zero_unpaired".
  TRL estimates z0 from the mismatched (KL) completions: ``kl = gather_for_metrics(mean(KL_logps − ref_KL_logps))
  .mean().clamp(min=0)``, i.e. the mean over ranks of each rank's mean; ``per_rank_kl_means`` stands in for that
  gather.  With equal shards that is the mean over the gathered batch.
  tests/losses/test_unpaired_trl.py checks this transcription against the installed TRL's own method.
* ``RunningMoments`` / ``bco_trl``: TRL 1.13.0, trl/experimental/bco/bco_trainer.py (``RunningMoments.update``,
  ``get_global_statistics`` and ``BCOTrainer.bco_loss``).  TRL 1.16 no longer ships BCOTrainer; 1.13 is the newest
  release that does, and its ``bco_loss`` is unchanged since BCO was added.  ``get_global_statistics`` reduces the
  sum, the count and the sum of squared deviations over ranks: here it receives the rank shards as a list.  The
  underlying-distribution-matching (UDM) weight, a density-ratio classifier on prompt embeddings, is not transcribed:
  prefzoo's ``bco`` does not implement it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

T = torch.Tensor


def kto_trl(
    policy_logps: T,
    ref_logps: T,
    labels: T,
    kl_logps: T | None,
    ref_kl_logps: T | None,
    *,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    loss_type: str = "kto",
    per_rank_kl_means: list[T] | None = None,
) -> tuple[T, T, T, T]:
    """(losses [desirable..., undesirable...], chosen_rewards, rejected_rewards, kl) as TRL 1.16 computes them."""
    calculate_KL = loss_type not in ["apo_zero_unpaired"]
    bool_labels = torch.as_tensor(labels, dtype=torch.bool)
    chosen_idx = torch.nonzero(bool_labels, as_tuple=False).view(-1)
    rejected_idx = torch.nonzero(~bool_labels, as_tuple=False).view(-1)
    chosen_logps = policy_logps.index_select(0, chosen_idx)
    rejected_logps = policy_logps.index_select(0, rejected_idx)
    ref_chosen_logps = ref_logps.index_select(0, chosen_idx)
    ref_rejected_logps = ref_logps.index_select(0, rejected_idx)

    if calculate_KL:
        kl = (kl_logps - ref_kl_logps).mean().detach()
        gathered = torch.stack(per_rank_kl_means) if per_rank_kl_means is not None else kl[None]  # gather_for_metrics
        kl = gathered.mean().clamp(min=0)
    else:
        kl = torch.zeros(1).to(chosen_logps.device)
    # Chosen losses
    if chosen_logps.shape[0] != 0 or ref_chosen_logps.shape[0] != 0:
        chosen_logratios = chosen_logps - ref_chosen_logps

        if loss_type == "kto":
            # Eqn (7) of the KTO paper (https://huggingface.co/papers/2402.01306)
            chosen_losses = 1 - F.sigmoid(beta * (chosen_logratios - kl))
        elif loss_type == "apo_zero_unpaired":
            # Unpaired variant of Eqn (7) of the APO paper (https://huggingface.co/papers/2408.06266)
            # Use this loss when you believe the chosen outputs are better than your model's default output
            chosen_losses = 1 - F.sigmoid(beta * chosen_logratios)

        chosen_rewards = beta * chosen_logratios.detach()

    else:
        # lists can't be empty -- if they are, then accelerate.gather will hang
        chosen_losses = torch.Tensor([]).to(policy_logps)
        chosen_rewards = torch.Tensor([]).to(policy_logps)
    # Rejected losses
    if rejected_logps.shape[0] != 0 or ref_rejected_logps.shape[0] != 0:
        rejected_logratios = rejected_logps - ref_rejected_logps

        if loss_type == "kto":
            rejected_losses = 1 - F.sigmoid(beta * (kl - rejected_logratios))
        elif loss_type == "apo_zero_unpaired":
            rejected_losses = F.sigmoid(beta * rejected_logratios)

        rejected_rewards = beta * rejected_logratios.detach()
    else:
        # lists can't be empty -- if they are, then accelerate.gather will hang
        rejected_losses = torch.Tensor([]).to(policy_logps)
        rejected_rewards = torch.Tensor([]).to(policy_logps)
    losses = torch.cat(
        (desirable_weight * chosen_losses, undesirable_weight * rejected_losses),
        0,
    )
    return losses, chosen_rewards, rejected_rewards, kl


@torch.no_grad()
def get_global_statistics(shards: list[T]) -> tuple[T, T, int]:
    """TRL's element-wise mean and variance across processes; ``accelerator.reduce`` (a sum) over ``shards``."""
    sum_and_count = torch.stack([torch.tensor([xs.sum(), xs.numel()], dtype=xs.dtype) for xs in shards]).sum(0)
    global_sum, count = sum_and_count
    global_mean = global_sum / count

    sum_var = torch.stack([torch.sum((xs - global_mean) ** 2) for xs in shards]).sum()
    global_var = sum_var / count

    return global_mean, global_var, int(count.item())


@dataclass
class RunningMoments:
    """TRL's running mean and standard deviation of a data stream (the BCO reward shift δ is ``mean``)."""

    mean: float = 0
    std: float = 1
    var: float = 1
    count: float = 1e-24

    @torch.no_grad()
    def update(self, xs: T, shards: list[T] | None = None) -> tuple[float, float]:
        """Updates running moments from batch's moments computed across ranks (``shards``: every rank's xs)"""
        if shards is not None:  # self.accelerator.use_distributed
            xs_mean, xs_var, xs_count = get_global_statistics(shards)
        else:
            xs_count = xs.numel()
            xs_var, xs_mean = torch.var_mean(xs, unbiased=False)
        xs_mean, xs_var = xs_mean.float(), xs_var.float()

        delta = xs_mean - self.mean
        tot_count = self.count + xs_count

        new_sum = xs_var * xs_count
        # correct old_sum deviation accounting for the new mean
        old_sum = self.var * self.count + delta**2 * self.count * xs_count / tot_count
        tot_sum = old_sum + new_sum

        self.mean += (delta * xs_count / tot_count).item()
        new_var = tot_sum / tot_count
        self.std = (new_var * tot_count / (tot_count - 1)).float().sqrt().item()
        self.var = new_var.item()
        self.count = tot_count

        return xs_mean.item(), (xs_var * xs_count / (xs_count - 1)).float().sqrt().item()


def bco_trl(
    policy_chosen_logps: T,
    policy_rejected_logps: T,
    reference_chosen_logps: T,
    reference_rejected_logps: T,
    running: RunningMoments,
    *,
    beta: float = 0.1,
    do_train: bool = True,
    shards: list[T] | None = None,
) -> tuple[T, T, T, T]:
    """BCOTrainer.bco_loss without UDM: (losses [chosen..., rejected...], chosen_rewards, rejected_rewards, delta).

    ``shards``: under several processes, every rank's ``cat(chosen_rewards, rejected_rewards)`` (what
    get_global_statistics reduces over); None on one process.
    """
    chosen_logratios = policy_chosen_logps - reference_chosen_logps
    chosen_rewards = beta * chosen_logratios

    rejected_logratios = policy_rejected_logps - reference_rejected_logps
    rejected_rewards = beta * rejected_logratios

    if do_train:
        running.update(torch.cat((chosen_rewards, rejected_rewards), 0).detach(), shards)
    delta = torch.as_tensor(running.mean, device=chosen_rewards.device)

    chosen_losses = -F.logsigmoid(chosen_rewards - delta)
    rejected_losses = -F.logsigmoid(-(rejected_rewards - delta))

    losses = torch.cat((chosen_losses, rejected_losses), dim=0)

    return losses, chosen_rewards, rejected_rewards, delta
