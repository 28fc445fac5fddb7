"""BCO's density-ratio weighting (UDM) against a transcription of TRL's BCOTrainer (the last version that had it).

TRL fits ``sklearn.linear_model.LogisticRegression(class_weight="balanced")`` on prompt embeddings
(``BCOTrainer.__init__``), predicts P(desirable | prompt) (``_get_chosen_prob``) and weights each undesirable
example's loss by ``(p / (1 - p + 1e-8)).clamp(min_density_ratio, max_density_ratio)`` (``_get_udm_weight``,
``bco_loss``).  sklearn runs here as the reference only; prefzoo's classifier is torch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import prefzoo
from prefzoo.losses.density_ratio import DensityRatioClassifier, udm_weights

F64 = torch.float64


def _embeddings(seed=0, n_d=30, n_u=12, d=6):
    """Imbalanced classes (30 vs 12) with overlapping Gaussian clouds: 'balanced' weights and the penalty matter."""
    g = torch.Generator().manual_seed(seed)
    shift = torch.linspace(-0.6, 0.9, d, dtype=F64)
    return (torch.randn(n_d, d, generator=g, dtype=F64) + shift, torch.randn(n_u, d, generator=g, dtype=F64) - shift)


def _sklearn_prob(des, und, test, **kw):
    linear_model = pytest.importorskip("sklearn.linear_model")
    emb = torch.cat((des, und), dim=0)
    labels = torch.cat((torch.ones_like(des[:, 0]), torch.zeros_like(und[:, 0])), dim=0)
    clf = linear_model.LogisticRegression(class_weight="balanced", **kw).fit(emb.numpy(), labels.numpy())
    return torch.as_tensor(clf.predict_proba(test.numpy())[:, 1], dtype=F64)


def test_classifier_equals_sklearn_balanced_logistic_regression():
    des, und = _embeddings()
    far = 3 * torch.randn(4, des.shape[1], generator=torch.Generator().manual_seed(9), dtype=F64)
    test = torch.cat((des[:5], und[:5], far))
    ours = DensityRatioClassifier.fit(des, und).prob_desirable(test)
    exact = _sklearn_prob(des, und, test, tol=1e-12, max_iter=10_000)
    torch.testing.assert_close(ours, exact, atol=1e-7, rtol=0)
    as_trl = _sklearn_prob(des, und, test)  # TRL's call: sklearn's default tol=1e-4, max_iter=100
    torch.testing.assert_close(ours, as_trl, atol=3e-3, rtol=0)  # sklearn stops early, where our optimum is exact


def test_classifier_reaches_the_optimum_on_large_norm_embeddings():
    """Mean-pooled hidden states can have norms in the thousands: the fit's line search still lands on sklearn's
    optimum there (a plain unit step of L-BFGS overshoots and diverges)."""
    des, und = _embeddings()
    des, und = 1000 * des, 1000 * und
    test = torch.cat((des[:5], und[:5]))
    ours = DensityRatioClassifier.fit(des, und).prob_desirable(test)
    exact = _sklearn_prob(des, und, test, tol=1e-12, max_iter=10_000)
    torch.testing.assert_close(ours, exact, atol=1e-6, rtol=0)


def test_the_class_weights_and_the_penalty_matter():
    """Without 'balanced' or without the L2 term the probabilities move: the comparison above can fail."""
    linear_model = pytest.importorskip("sklearn.linear_model")
    des, und = _embeddings()
    test = des[:8]
    ours = DensityRatioClassifier.fit(des, und).prob_desirable(test)
    emb = torch.cat((des, und)).numpy()
    labels = torch.cat((torch.ones(len(des)), torch.zeros(len(und)))).numpy()
    plain = linear_model.LogisticRegression(tol=1e-12, max_iter=10_000).fit(emb, labels)
    assert float((ours - torch.as_tensor(plain.predict_proba(test.numpy())[:, 1])).abs().max()) > 1e-2
    weak = DensityRatioClassifier.fit(des, und, c=100.0).prob_desirable(test)
    assert float((ours - weak).abs().max()) > 1e-3


class RunningMoments:
    """TRL's RunningMoments.update (one process), for the mean δ."""

    def __init__(self):
        self.mean, self.count = 0.0, 1e-24

    def update(self, xs):
        xs_count = xs.numel()
        xs_mean = xs.mean().item()
        delta = xs_mean - self.mean
        tot_count = self.count + xs_count
        self.mean += delta * xs_count / tot_count
        self.count = tot_count


def trl_bco_loss(running, clf_prob, beta, pc, pr, rc, rr, min_ratio, max_ratio):
    """BCOTrainer.bco_loss with match_underlying_distribution, transcribed (clf_prob: _get_chosen_prob)."""
    chosen_rewards = beta * (pc - rc)
    rejected_rewards = beta * (pr - rr)
    running.update(torch.cat((chosen_rewards, rejected_rewards), 0).detach())
    delta = torch.as_tensor(running.mean)
    chosen_losses = -F.logsigmoid(chosen_rewards - delta)
    rejected_losses = -F.logsigmoid(-(rejected_rewards - delta))
    prob_desirable = clf_prob
    weight = (prob_desirable / (1 - prob_desirable + 1e-8)).clamp(min=min_ratio, max=max_ratio)
    return torch.cat((torch.ones_like(chosen_losses) * chosen_losses, weight * rejected_losses), dim=0)


@pytest.mark.parametrize(("lo", "hi"), [(0.5, 10.0), (0.9, 1.2)])
def test_weighted_bco_equals_trl_match_underlying_distribution(lo, hi):
    des, und = _embeddings(seed=1)
    clf = DensityRatioClassifier.fit(des, und)
    g = torch.Generator().manual_seed(3)
    n = 10
    labels = torch.tensor([True, False, False, True, False, True, False, False, True, False])
    prompts = torch.where(labels[:, None], des[:n], und[:n])  # each example's prompt embedding
    policy = (-20 * torch.rand(n, generator=g, dtype=F64)).requires_grad_()
    ref = -20 * torch.rand(n, generator=g, dtype=F64)
    prob = clf.prob_desirable(prompts)
    batch = prefzoo.UnpairedBatch(
        policy_logps=policy, ref_logps=ref, labels=labels, density_ratio_weights=udm_weights(prob, labels, lo, hi)
    )  # the trainer's field
    ours = prefzoo.get_loss("bco", beta=0.3)(batch).losses  # the loss applies the weights
    order = torch.cat((torch.nonzero(labels)[:, 0], torch.nonzero(~labels)[:, 0]))  # TRL: desirable first
    p64 = policy.detach().clone().requires_grad_()
    theirs = trl_bco_loss(RunningMoments(), prob[~labels], 0.3, p64[labels], p64[~labels], ref[labels], ref[~labels],
                          lo, hi)  # fmt: skip
    torch.testing.assert_close(ours[order], theirs, atol=1e-9, rtol=1e-9)  # TRL's count starts at 1e-24
    g_ours = torch.autograd.grad(ours.sum(), policy)[0]
    g_theirs = torch.autograd.grad(theirs.sum(), p64)[0]
    torch.testing.assert_close(g_ours, g_theirs, atol=1e-9, rtol=1e-9)
    w = udm_weights(prob, labels, lo, hi)
    assert bool((w[labels] == 1).all()) and bool(((w[~labels] >= lo) & (w[~labels] <= hi)).all())
    assert len(set(w[~labels].tolist())) > 1  # the undesirable weights differ by prompt


def test_hand_derived_weights():
    # p = 0.8: ratio 4 (within [0.5, 10]); p = 0.2: 0.25 → 0.5; p = 0.99: 99 → 10; desirable: 1 whatever p
    p = torch.tensor([0.8, 0.2, 0.99, 0.2], dtype=F64)
    labels = torch.tensor([False, False, False, True])
    assert udm_weights(p, labels).tolist() == pytest.approx([4.0, 0.5, 10.0, 1.0], rel=1e-7)


def test_classifier_round_trips_and_refuses_one_class():
    des, und = _embeddings()
    clf = DensityRatioClassifier.fit(des, und)
    again = DensityRatioClassifier.from_state_dict(clf.state_dict())
    assert torch.equal(again.prob_desirable(des), clf.prob_desirable(des))
    with pytest.raises(ValueError, match="desirable and undesirable prompts, got 30 and 0"):
        DensityRatioClassifier.fit(des, und[:0])


@pytest.mark.parametrize(("des", "und"), [((3, 4), (2, 5)), ((3,), (2, 4)), ((3, 4), (2, 4, 1))])
def test_classifier_names_both_shapes_when_the_embeddings_do_not_fit(des, und):
    shape = ", ".join  # (3, 4) -> "3, 4"
    want = rf"must be \(n, D\) with one D, got \({shape(map(str, des))},?\) and \({shape(map(str, und))},?\)$"
    with pytest.raises(ValueError, match=want):
        DensityRatioClassifier.fit(torch.zeros(des), torch.zeros(und))


def test_default_embedding_mean_pools_the_prompt_tokens_of_a_tiny_model():
    transformers = pytest.importorskip("transformers")
    from prefzoo.model.embedding import mean_pooled_hidden_states

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    lm = transformers.LlamaForCausalLM(cfg).eval()
    embed = mean_pooled_hidden_states(lm)
    rows = [[5, 7, 9, 11], [3, 4]]
    ids = torch.tensor([rows[0], rows[1] + [0, 0]])  # right-padded
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    got = embed(ids, mask)  # (2, 16)
    for i, r in enumerate(rows):  # each row alone, unpadded: the mean of its last hidden states
        h = lm(input_ids=torch.tensor([r]), output_hidden_states=True).hidden_states[-1][0]
        torch.testing.assert_close(got[i], h.mean(0), atol=1e-5, rtol=1e-5)
    des, und = embed(ids[:1], mask[:1]), embed(ids[1:], mask[1:])
    assert DensityRatioClassifier.fit(des, und).prob_desirable(got).shape == (2,)  # plugs into the classifier


def test_weights_reach_only_a_loss_that_declares_them():
    """bco declares LossSpec.density_ratio_weights; giving the weights to a loss that would ignore them is an error."""
    labels = torch.tensor([True, False, False])
    kw = dict(policy_logps=torch.tensor([-3.0, -4.0, -5.0]), ref_logps=torch.tensor([-3.5, -3.0, -5.5]), labels=labels)
    w = torch.tensor([1.0, 4.0, 0.5])
    plain = prefzoo.get_loss("bco")(prefzoo.UnpairedBatch(**kw)).losses
    weighted = prefzoo.get_loss("bco")(prefzoo.UnpairedBatch(**kw, density_ratio_weights=w)).losses
    torch.testing.assert_close(weighted, w * plain)  # each example's loss times its weight (δ = the same batch mean)
    assert prefzoo.loss_spec("bco").density_ratio_weights and not prefzoo.loss_spec("kto").density_ratio_weights
    with pytest.raises(prefzoo.PreferenceBatchError, match="loss 'kto' does not use density-ratio weights"):
        prefzoo.get_loss("kto")(prefzoo.UnpairedBatch(**kw, density_ratio_weights=w, kl_policy_logps=kw["ref_logps"],
                                                      kl_ref_logps=kw["ref_logps"]))  # fmt: skip
    with pytest.raises(prefzoo.UnpairedBatchError, match=r"density_ratio_weights\[1\] is negative"):
        prefzoo.UnpairedBatch(**kw, density_ratio_weights=torch.tensor([1.0, -1.0, 0.5]))


def test_the_fit_is_the_balanced_objectives_minimum_in_float64():
    """3 desirable and 4 undesirable prompts: class weights 7/6 and 7/8, neither exact in float32.  An independent
    Newton solve of C·Σ s_i·BCE + ½‖w‖² in float64 agrees with the fit to 1e-8 (weights rounded to float32 moved the
    minimum by 3e-8)."""
    des, und = _embeddings(n_d=3, n_u=4, d=2)
    clf = DensityRatioClassifier.fit(des, und)
    x, y = torch.cat((des, und)), torch.cat((torch.ones(3, dtype=F64), torch.zeros(4, dtype=F64)))
    s = torch.where(y > 0, torch.tensor(7 / 6, dtype=F64), torch.tensor(7 / 8, dtype=F64))

    def objective(t):
        z = x @ t[:-1] + t[-1]
        return (s * F.binary_cross_entropy_with_logits(z, y, reduction="none")).sum() + 0.5 * (t[:-1] ** 2).sum()

    t = torch.zeros(3, dtype=F64)
    for _ in range(30):
        grad = torch.autograd.functional.jacobian(objective, t)
        t = t - torch.linalg.solve(torch.autograd.functional.hessian(objective, t), grad)
    assert float(torch.autograd.functional.jacobian(objective, t).abs().max()) < 1e-14
    torch.testing.assert_close(torch.cat((clf.weight, clf.bias.reshape(1))), t, rtol=0, atol=1e-8)
