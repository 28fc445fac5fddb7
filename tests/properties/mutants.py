"""Deliberately broken losses, registered as a plugin through build_registry(extra_plugins=...).

Each mutant is a copy of a shipped loss with one classic bug; the mutation check
(test_mutations.py) confirms the property suite catches every one.  The shipped
modules are not touched.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

import prefzoo
from prefzoo.losses import dpo as dpo_mod
from prefzoo.losses import mmpo as mmpo_mod
from prefzoo.types import LossContext, LossOutput


def naive_lse_loss(batch, p, ctx):
    """mmpo-no-aux with log(exp(s_w) + exp(s_l)): underflows to −inf below about −88 (float32) / −745 (float64)."""
    s_w, s_l, m = mmpo_mod._scores(batch, p, ctx)
    return LossOutput(-torch.log(torch.exp(s_w) + torch.exp(s_l)), s_w.detach(), s_l.detach(), m)


def no_gather_loss(batch, p, ctx):
    """mmpo-no-aux normalizing over the local shard only (the gather hook is ignored)."""
    return mmpo_mod.mmpo_no_aux_loss(batch, p, LossContext())


def flipped_aux_loss(batch, p, ctx):
    """mmpo with + log σ(s_w − s_l) instead of − log σ(s_w − s_l)."""
    s_w, s_l, m = mmpo_mod._scores(batch, p, ctx)
    losses = -torch.logsumexp(torch.stack((s_w, s_l), dim=1), dim=1) + F.logsigmoid(s_w - s_l)
    return LossOutput(losses, s_w.detach(), s_l.detach(), m)


def no_length_norm_loss(batch, p, ctx):
    """mmpo-length-norm that forgets to divide by |y| (computes plain mmpo)."""
    return mmpo_mod.mmpo_loss(batch, p, ctx)


def nan_on_tie_loss(batch, p, ctx):
    """dpo with a 'normalized' margin (Δ/|Δ|)·|Δ|: 0/0 = NaN on the input where log π(y_w) = log π(y_l)."""
    out = dpo_mod.dpo_loss(batch, p, ctx)
    m = batch.policy_chosen_logps - batch.policy_rejected_logps
    return LossOutput(out.losses * (m / m.abs()) * (m / m.abs()), out.chosen_rewards, out.rejected_rewards)


def _like(name: str, new: str, fn) -> prefzoo.LossSpec:
    spec = prefzoo.loss_spec(name)
    return dataclasses.replace(spec, name=new, fn=fn, description=f"MUTANT of {name}: {fn.__doc__}")


MUTANTS = {  # mutant name -> (shipped loss it copies, the property that must catch it)
    "mutant-naive-lse": ("mmpo-no-aux", "finite"),
    "mutant-no-gather": ("mmpo-no-aux", "sharded-gather"),
    "mutant-flipped-aux": ("mmpo", "monotone"),
    "mutant-no-length-norm": ("mmpo-length-norm", "reference"),
    "mutant-nan-on-tie": ("dpo", "finite"),
}
_FNS = {
    "mutant-naive-lse": naive_lse_loss,
    "mutant-no-gather": no_gather_loss,
    "mutant-flipped-aux": flipped_aux_loss,
    "mutant-no-length-norm": no_length_norm_loss,
    "mutant-nan-on-tie": nan_on_tie_loss,
}


class MutantsPlugin:
    """A pluggy plugin object registering the mutants."""

    @prefzoo.hookimpl
    def prefzoo_register_losses(self) -> list[prefzoo.LossSpec]:
        return [_like(orig, name, _FNS[name]) for name, (orig, _) in MUTANTS.items()]


def mutant_registry():
    """A registry with the built-ins plus the mutants (plugin autoloading off, so only these)."""
    from prefzoo.registry import build_registry

    return build_registry(extra_plugins=[("prefzoo-mutants", MutantsPlugin())], autoload=False)
