"""The pair checks' edges that a complete mutation run of prefzoo/testing/properties.py found untested: the shift
check on pairs without references and the shifts it applies, the decoupled check's float64, the reference check's
per-example default, its float64 and its messages, and the reference-free check's bare call."""

from __future__ import annotations

import pytest
import torch

import prefzoo
from prefzoo.testing import properties as P
from tests.testing._probes import drifting, probe_loss
from tests.testing.test_property_check_tolerances import _margin
from tests.testing.test_property_checks import _batch

F = torch.float64
NEVER = lambda i, b, ctx: False  # noqa: E731
LENGTHS = torch.tensor([3, 5, 4])
LOGP_FIELDS = ("policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps")


def _recording(seen: list, base: str = "dpo"):
    """A sound loss (DPO's margin, or the policy's for reference-free ``base``) that keeps every batch it is given."""

    def read(b, p):
        seen.append(b)
        return b.policy_chosen_logps - b.policy_rejected_logps if b.ref_chosen_logps is None else _margin(b)

    return drifting(base, read, NEVER)


def test_the_shift_check_shifts_each_response_by_its_own_c_of_either_sign():
    """c_w = 100·sin k and c_l = −50·cos k for pair k = 1..B, on the policy and the reference alike, in float64:
    shifts that differ per pair and per side, of either sign and up to 100."""
    seen: list = []
    P.check_shift_invariance(_recording(seen), _batch())
    b, k = _batch(), torch.arange(1.0, 4.0, dtype=F)
    shifted = seen[-1]
    for side, c in (("chosen", 100 * torch.sin(k)), ("rejected", -50 * torch.cos(k))):
        for who in ("policy", "ref"):
            name = f"{who}_{side}_logps"
            assert torch.equal(getattr(shifted, name), getattr(b, name) + c), name


def test_the_shift_check_runs_on_pairs_without_references():
    """A reference-free loss declared shift-invariant is checked on bare pairs (the shifted batch has no references
    either): a constant loss passes, and simpo, which reads log π(y) itself, fails with the check's message."""
    const = drifting("simpo", lambda b, p: 0.0 * b.policy_chosen_logps, NEVER, shift_invariant=True)
    bare = _batch(ref_chosen_logps=None, ref_rejected_logps=None, chosen_lengths=LENGTHS, rejected_lengths=LENGTHS)
    P.check_shift_invariance(const, bare)
    reads = probe_loss(prefzoo.loss_spec("simpo").fn, "simpo", shift_invariant=True)
    with pytest.raises(P.PropertyFailure, match=r"^probe: loss changed when c was added to policy and reference"):
        P.check_shift_invariance(reads, bare)


def test_the_permutation_decoupled_and_reference_checks_compute_in_float64_for_any_batch():
    """Their tolerances (1e-9 and 1e-12 relative) are only meaningful in float64: float32 pairs are cast first."""
    seen: list = []
    b32 = _batch(**{n: getattr(_batch(), n).float() for n in LOGP_FIELDS})
    loss = _recording(seen)
    P.check_permutation(loss, b32)
    P.check_batch_decoupled(loss, b32)
    P.check_matches_reference(loss, b32, lambda b, p: torch.zeros(3))
    assert len(seen) == 2 + 3 + 1 and all(b.policy_chosen_logps.dtype == F for b in seen)


def test_the_reference_check_reads_a_formula_of_plain_floats_in_float64():
    """A reference formula may return Python floats: they are read as float64 (float32 would be off by 1e-8)."""
    third = drifting("dpo", lambda b, p: b.policy_chosen_logps * 0.0, NEVER, level=1 / 3)
    P.check_matches_reference(third, _batch(), lambda b, p: [1 / 3] * 3)


def test_the_reference_check_compares_each_pair_unless_asked_for_the_mean():
    """A loss that gives the formula's values to the wrong pairs has the right mean: it fails per pair (the default),
    at its first wrong pair, and passes ``mean_only``; a wrong mean fails there at index 0 of the one mean."""
    flipped = drifting("dpo", lambda b, p: _margin(b).flip(0), NEVER, slope=1.0)
    with pytest.raises(P.PropertyFailure, match=r"^probe: loss vs float64 reference formula at example 0 \(policy_"):
        P.check_matches_reference(flipped, _batch(), lambda b, p: _margin(b))
    P.check_matches_reference(flipped, _batch(), lambda b, p: _margin(b), mean_only=True)
    with pytest.raises(P.PropertyFailure, match=r"^probe: loss vs float64 reference formula at index 0: got "):
        P.check_matches_reference(flipped, _batch(), lambda b, p: _margin(b) + 1.0, mean_only=True)


def test_the_reference_free_check_calls_the_loss_first_without_any_reference():
    """Then with both: a loss that read a reference half-removed would go unseen."""
    seen: list = []
    P.check_reference_free(_recording(seen, "simpo"), _batch(chosen_lengths=LENGTHS, rejected_lengths=LENGTHS))
    assert [(b.ref_chosen_logps is None, b.ref_rejected_logps is None) for b in seen] == [(True, True), (False, False)]


def test_the_permutation_is_seeded_by_the_batch_size_not_the_global_rng():
    """The same permutation under any global seed (a failure reproduces), and the caller's RNG left as it was."""
    perms = []
    for seed in (0, 1):
        seen: list = []
        torch.manual_seed(seed)
        before = torch.get_rng_state()
        P.check_permutation(_recording(seen), _batch())
        assert torch.equal(torch.get_rng_state(), before)
        perms.append(seen[1].policy_chosen_logps)
    assert torch.equal(perms[0], perms[1]) and perms[0].tolist() == [-4.0, -1.0, -2.0]  # [1, 0, 2]


@pytest.mark.parametrize("shape", ["pairs", "groups"])
def test_the_low_precision_checks_leave_the_global_rng_alone(shape):
    from prefzoo.testing import properties_shapes as S
    from tests.testing.test_shape_checks import _groups

    check, name, batch = (P.check_low_precision, "dpo", _batch) if shape == "pairs" else (
        S.check_shape_low_precision, "dpo-pl", _groups)  # fmt: skip
    torch.manual_seed(5)
    before = torch.get_rng_state()
    check(prefzoo.get_loss(name), batch())
    assert torch.equal(torch.get_rng_state(), before)


def test_a_batch_coupled_loss_is_compared_through_its_mean_and_named_by_index():
    """The low-precision and shift checks compare a batch-coupled loss's mean (a per-pair split may jump at ties):
    a failure names index 0 of that one mean, not a pair."""
    low = lambda i, b, ctx: b.policy_chosen_logps.dtype != F  # noqa: E731
    coupled = drifting("dpo", lambda b, p: _margin(b), low, value=1.0, batch_coupled=True)
    with pytest.raises(P.PropertyFailure, match=r"^probe: torch.float32 loss vs float64 on the same inputs at index 0"):
        P.check_low_precision(coupled, _batch(), dtypes=(torch.float32,))
    shifted = drifting("dpo", lambda b, p: _margin(b), lambda i, b, ctx: i == 3, value=1.0, batch_coupled=True)
    with pytest.raises(P.PropertyFailure, match=r"^probe: loss changed when c was added .* response at index 0: got"):
        P.check_shift_invariance(shifted, _batch())


def test_finite_names_the_loss_and_the_pair_that_is_not_finite():
    nan = lambda b, p: torch.log(torch.tensor([1.0, -1.0, 1.0], dtype=F)) + 0 * _margin(b)  # noqa: E731
    nan_at_1 = drifting("dpo", nan, NEVER, slope=1.0)
    with pytest.raises(P.PropertyFailure) as e:
        P.check_finite(nan_at_1, _batch())
    assert str(e.value) == (
        "probe: losses[1] = nan is not finite at example 1 (policy_chosen_logps=-4.0, policy_rejected_logps=-1.5, "
        "ref_chosen_logps=-3.0, ref_rejected_logps=-2.0) (dtype torch.float64)"
    )


def test_the_sharded_check_splits_across_four_ranks_by_default():
    """Five pairs over four ranks, the first holding one: [1, 2, 1, 1] (five ranks would be [1, 1, 1, 1, 1])."""
    five = _batch(**{n: torch.cat((getattr(_batch(), n), getattr(_batch(), n)[:2])) for n in LOGP_FIELDS})
    drift = drifting("dpo", lambda b, p: _margin(b), lambda i, b, ctx: ctx.distributed, value=1.0)
    with pytest.raises(P.PropertyFailure, match=r"^probe: per-example loss sharded as \[1, 2, 1, 1\] with the gather"):
        P.check_sharded_gather(drift, five)
