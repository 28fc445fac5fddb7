"""prefzoo.nn's fused head + loss equals the unfused computation (full logits → log-softmax → gather → loss).

Loss and gradients with respect to the LM-head weight, its bias and the hidden states, for losses of every shape
(pairs, lists of K, unpaired rows), a plugin-registered loss, combinations and modifiers, the model's logit
transform, and ignored (-100) targets.  The reference is tests/nn/reference.py (float64 logits).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from prefzoo.nn import FusedLinearPreferenceLoss, PreferenceLoss
from prefzoo.registry import get_loss
from tests.nn.reference import IGNORE, group_batch, needed, pair_batch, row_fields, token_scores, unpaired_batch

V = 37  # vocabulary


def make_rows(r: int, t: int = 14, h: int = 8, seed: int = 0, prompt: int = 3) -> tuple[torch.Tensor, ...]:
    """(w (V, H), x (R, T, H), ref_x (R, T, H), target (R, T)): a prompt, ragged right padding, one ignored hole."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(V, h, generator=g) * 0.6
    x = torch.randn(r, t, h, generator=g)
    ref_x = x + 0.3 * torch.randn(r, t, h, generator=g)
    target = torch.randint(0, V, (r, t), generator=g)
    target[:, :prompt] = IGNORE
    for i in range(r):
        target[i, t - (i % 4) :] = IGNORE  # ragged lengths
    target[0, prompt + 1] = IGNORE  # a hole inside a completion
    return w, x, ref_x, target


def run_both(loss: str, params: dict[str, Any], r: int, build: Any, call_kw: dict[str, Any], **opts: Any) -> None:
    """Fused and unfused loss and gradients on the same rows are equal."""
    modifiers = opts.pop("modifiers", ())
    bias_on, scale, softcap, h = opts.get("bias", False), opts.get("scale", 1.0), opts.get("softcap"), opts.get("h", 8)
    w, x, ref_x, target = make_rows(r, h=h, seed=opts.get("seed", 0))
    b = torch.randn(V) * 0.3 if bias_on else None
    module = FusedLinearPreferenceLoss(loss, modifiers=modifiers, logit_scale=scale, softcap=softcap,
                                       keep_bytes=opts.get("keep_bytes"), **params)
    leaves1 = [t.clone().requires_grad_() for t in (w, x, *([b] if b is not None else []))]
    got, aux = module(leaves1[0], leaves1[1], target, leaves1[2] if b is not None else None, ref_input=ref_x, **call_kw)
    got.backward()

    leaves2 = [t.clone().double().requires_grad_() for t in (w, x, *([b] if b is not None else []))]
    s = token_scores(leaves2[0], leaves2[1], target, leaves2[2] if b is not None else None, scale, softcap)
    with torch.no_grad():
        ref = token_scores(w, ref_x, target, b, scale, softcap)
    unfused = get_loss(loss, modifiers, **params)
    want = unfused(build(needed(row_fields(s, ref), unfused.needs))).losses.mean()
    want.backward()

    torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(aux.policy_logps, s["lp"].sum(1).float().detach(), rtol=1e-4, atol=1e-4)
    for name, a, e in zip(("weight", "input", "bias")[: len(leaves1)], leaves1, leaves2, strict=True):
        assert a.grad is not None and float(a.grad.abs().sum()) > 0, name
        torch.testing.assert_close(a.grad, e.grad.float(), rtol=1e-3, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


PAIR_LOSSES = [
    ("dpo", {"beta": 0.1}, {}),
    ("simpo", {}, {}),
    ("orpo", {}, {}),
    ("ipo", {}, {}),
    ("mmpo-entropy", {}, {}),  # per-token log-probs and entropies
    ("0.8*dpo + 0.2*sft", {}, {}),  # a weighted sum
    ("dpo", {}, {"modifiers": ["ld-dpo:alpha=0.5"]}),  # per-token reference log-probs
    ("dpo", {}, {"modifiers": ["wpo"]}),  # per-token log Σ p²
    ("dpo", {"beta": 0.2}, {"h": 24}),  # rows shorter than H: the per-token head, not the row path
    ("dpo", {}, {"keep_bytes": 0}),  # nothing kept: logits recomputed in backward
    ("mmpo-entropy", {}, {"keep_bytes": 0, "softcap": 3.0}),
]


PAIR_IDS = ["dpo", "simpo", "orpo", "ipo", "mmpo-entropy", "dpo+sft", "dpo-ld-dpo", "dpo-wpo", "dpo-per-token-head",
            "dpo-recompute", "mmpo-entropy-recompute"]


@pytest.mark.parametrize(("loss", "params", "opts"), PAIR_LOSSES, ids=PAIR_IDS)
def test_pair_losses_match_the_unfused_computation(loss, params, opts) -> None:
    run_both(loss, params, 6, pair_batch, {}, **opts)


LIST_LOSSES = [("dpo-pl", {}, 3, False), ("rrhf", {}, 4, False), ("lipo", {}, 3, True), ("mmpo-list", {}, 3, True)]


@pytest.mark.parametrize(("loss", "params", "k", "with_scores"), LIST_LOSSES)
def test_list_losses_match_the_unfused_computation(loss, params, k, with_scores) -> None:
    scores = torch.randn(2 * k) if with_scores else None
    kw = {"group_size": k, **({"scores": scores} if with_scores else {})}
    run_both(loss, params, 2 * k, lambda f: group_batch(f, k, scores), kw)


UNPAIRED_LOSSES = [("kto", {}, True), ("apo-zero-unpaired", {}, False), ("bco", {}, False)]


@pytest.mark.parametrize(("loss", "params", "with_kl"), UNPAIRED_LOSSES)
def test_unpaired_losses_match_the_unfused_computation(loss, params, with_kl) -> None:
    labels = torch.tensor([True, False, True, True, False, False, True])
    kl = (torch.randn(7) - 20, torch.randn(7) - 20) if with_kl else None
    kw = {"labels": labels, **({"kl_policy_logps": kl[0], "kl_ref_logps": kl[1]} if kl else {})}
    run_both(loss, params, 7, lambda f: unpaired_batch(f, labels, kl), kw)


@pytest.mark.parametrize(("softcap", "scale", "bias"), [(3.0, 1.0, False), (2.5, 0.7, True), (None, 1.3, True)])
def test_the_logit_transform_and_a_bias_match(softcap, scale, bias) -> None:
    """Soft-capping, a logit scale and a bias on the head, in the loss and in every gradient (bias included)."""
    run_both("dpo", {"beta": 0.5}, 4, pair_batch, {}, softcap=softcap, scale=scale, bias=bias)
    run_both("mmpo-entropy", {}, 4, pair_batch, {}, softcap=softcap, scale=scale, bias=bias)


def test_ignored_positions_neither_count_nor_receive_gradient() -> None:
    """What sits at a -100 target (prompt, padding, a hole) changes nothing, and its hidden state gets 0 gradient."""
    w, x, _, target = make_rows(4)
    module = PreferenceLoss("simpo")
    x1 = x.clone().requires_grad_()
    loss1, _ = module(w, x1, target)
    loss1.backward()
    ignored = target == IGNORE
    x2 = torch.where(ignored.unsqueeze(-1), torch.randn_like(x) * 50, x)
    loss2, _ = module(w, x2, target)
    torch.testing.assert_close(loss1, loss2)
    assert x1.grad is not None
    assert bool((x1.grad[ignored] == 0).all()) and bool((x1.grad[~ignored] != 0).any())


def test_precomputed_reference_log_probs_equal_reference_hidden_states() -> None:
    """ref_logps per row (R,) or per position (R, T) give the loss that ref_input and ref_weight give."""
    w, x, ref_x, target = make_rows(6)
    ref_w = w + 0.1
    module = FusedLinearPreferenceLoss("dpo", modifiers=["ld-dpo:alpha=0.3"])
    from_hidden, _ = module(w, x, target, None, ref_x, ref_w)
    per_token = token_scores(ref_w, ref_x, target)["lp"].float()  # (R, T), 0 at ignored positions
    from_tokens, _ = module(w, x, target, ref_logps=per_token)
    torch.testing.assert_close(from_tokens, from_hidden)
    plain = FusedLinearPreferenceLoss("dpo")
    torch.testing.assert_close(plain(w, x, target, ref_logps=per_token.sum(1))[0], plain(w, x, target, None, ref_x,
                                                                                          ref_w)[0])  # fmt: skip


def test_a_frozen_head_gives_the_input_gradient() -> None:
    """A head without gradient (LoRA, a tied frozen head) takes the stored-product path: same input gradient."""
    w, x, ref_x, target = make_rows(4)
    grads = []
    for w_grad in (True, False):
        x1 = x.clone().requires_grad_()
        loss, _ = FusedLinearPreferenceLoss("dpo")(w.clone().requires_grad_(w_grad), x1, target, ref_input=ref_x)
        loss.backward()
        grads.append(x1.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


def test_a_stateful_loss_keeps_its_state_in_the_state_dict() -> None:
    """BCO's running reward mean moves on a training call and travels with the module's state_dict."""
    w, x, ref_x, target = make_rows(4)
    labels = torch.tensor([True, False, True, False])
    a = FusedLinearPreferenceLoss("bco")
    before = a.loss_fn.state_dict()
    a(w, x, target, ref_input=ref_x, labels=labels)
    moved = a.loss_fn.state_dict()
    assert any(not torch.equal(before[k], moved[k]) for k in before)
    b = FusedLinearPreferenceLoss("bco")
    b.load_state_dict(a.state_dict())
    assert all(torch.equal(b.loss_fn.state_dict()[k], moved[k]) for k in moved)
