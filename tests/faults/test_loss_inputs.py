"""Bad loss inputs are refused at the API boundary (PreferenceBatch / Loss) with the field named."""

from __future__ import annotations

import pytest
import torch

import prefzoo
from prefzoo.types import PreferenceBatch, PreferenceBatchError


def _fields(**kw):
    base = dict(
        policy_chosen_logps=torch.tensor([-1.0, -2.0]),
        policy_rejected_logps=torch.tensor([-1.5, -2.5]),
        ref_chosen_logps=torch.tensor([-1.2, -2.2]),
        ref_rejected_logps=torch.tensor([-1.4, -2.4]),
        chosen_lengths=torch.tensor([3, 4]),
        rejected_lengths=torch.tensor([2, 5]),
        example_ids=("a", "b"),
    )
    base.update(kw)
    return base


CASES = [
    ("nan", dict(policy_chosen_logps=torch.tensor([-1.0, float("nan")])), r"policy_chosen_logps\[1\] \(example 'b'\)"),
    ("inf", dict(ref_rejected_logps=torch.tensor([float("-inf"), -1.0])), r"ref_rejected_logps\[0\].*finite"),
    ("zero length", dict(chosen_lengths=torch.tensor([0, 4])), r"chosen_lengths\[0\] = 0.*positive"),
    ("negative length", dict(rejected_lengths=torch.tensor([2, -1])), r"rejected_lengths\[1\] = -1"),
    ("fractional length", dict(chosen_lengths=torch.tensor([1.5, 2.0])), r"chosen_lengths must hold whole token"),
    ("bool length", dict(chosen_lengths=torch.tensor([True, True])), r"chosen_lengths must hold whole token"),
    ("batch size", dict(policy_rejected_logps=torch.tensor([-1.0, -2.0, -3.0])), r"policy_rejected_logps has shape"),
    ("ids", dict(example_ids=("a",)), r"example_ids has 1 ids for B = 2"),
    ("int logps", dict(policy_chosen_logps=torch.tensor([1, 2])), r"policy_chosen_logps must be a floating-point"),
    ("list", dict(policy_chosen_logps=[-1.0, -2.0]), r"policy_chosen_logps must be a torch.Tensor"),
    ("2-D", dict(policy_chosen_logps=torch.zeros(2, 1)), r"policy_chosen_logps must have shape \(B,\)"),
    ("device", dict(ref_chosen_logps=torch.empty(2, device="meta")), r"ref_chosen_logps is on meta but"),
    ("mask dtype", dict(policy_chosen_token_logps=torch.zeros(2, 3), chosen_mask=torch.ones(2, 3)), r"chosen_mask"),
    ("token rows", dict(policy_chosen_token_logps=torch.zeros(3, 3)), r"policy_chosen_token_logps must have shape"),
]


@pytest.mark.parametrize(("label", "changes", "match"), CASES, ids=[c[0] for c in CASES])
def test_bad_batches_name_the_field(label, changes, match):
    with pytest.raises(PreferenceBatchError, match=match):
        PreferenceBatch(**_fields(**changes))


def test_integral_float_lengths_and_low_precision_logps_are_accepted():
    b = PreferenceBatch(
        **_fields(
            chosen_lengths=torch.tensor([3.0, 4.0]),
            policy_chosen_logps=torch.tensor([-1.0, -2.0], dtype=torch.bfloat16),
            policy_rejected_logps=torch.tensor([-1.5, -2.5], dtype=torch.float16),
        )
    )
    out = prefzoo.get_loss("simpo")(b)
    assert out.losses.dtype == torch.float32 and bool(torch.isfinite(out.losses).all())


def test_a_loss_missing_a_needed_input_names_it():
    b = PreferenceBatch(**_fields(ref_chosen_logps=None, ref_rejected_logps=None))
    with pytest.raises(PreferenceBatchError, match=r"loss 'dpo' needs reference.*ref_chosen_logps"):
        prefzoo.get_loss("dpo")(b)
