"""group_from_pairs: a PreferenceBatch as K = 2 groups, every field carried (chosen in column 0, rejected in 1)."""

from __future__ import annotations

import torch

import prefzoo
from prefzoo.types import group_from_pairs

F = torch.float64


def test_every_field_is_carried_with_token_fields_padded_to_the_longer_response():
    t = lambda *v: torch.tensor(v, dtype=F)  # noqa: E731
    tw, tl = t([-0.5, -0.5], [-1.0, 0.0]), t([-0.25, -0.25, -0.5], [-2.0, 0.0, 0.0])
    hw, hl = t([1.0, 2.0], [3.0, 0.0]), t([4.0, 5.0, 6.0], [7.0, 0.0, 0.0])
    mw, ml = tw != 0, tl != 0
    b = prefzoo.PreferenceBatch(
        t(-1.0, -1.0), t(-1.0, -2.0), ref_chosen_logps=t(-3.0, -4.0), ref_rejected_logps=t(-5.0, -6.0),
        chosen_lengths=torch.tensor([2, 1]), rejected_lengths=torch.tensor([3, 1]), policy_chosen_token_logps=tw,
        policy_rejected_token_logps=tl, chosen_token_entropies=hw, rejected_token_entropies=hl, chosen_mask=mw,
        rejected_mask=ml, example_ids=("p0", "p1"),
    )  # fmt: skip
    g = group_from_pairs(b)
    assert g.policy_logps.tolist() == [[-1.0, -1.0], [-1.0, -2.0]]
    assert g.ref_logps.tolist() == [[-3.0, -5.0], [-4.0, -6.0]] and g.lengths.tolist() == [[2, 3], [1, 1]]
    assert g.policy_token_logps.shape == g.token_entropies.shape == g.token_mask.shape == (2, 2, 3)
    assert g.policy_token_logps[:, 0].tolist() == [[-0.5, -0.5, 0.0], [-1.0, 0.0, 0.0]]
    assert torch.equal(g.policy_token_logps[:, 1], tl)
    assert g.token_entropies[:, 0].tolist() == [[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]
    assert torch.equal(g.token_entropies[:, 1], hl)
    assert g.token_mask[:, 0].tolist() == [[True, True, False], [True, False, False]]
    assert torch.equal(g.token_mask[:, 1], ml) and g.example_ids == ("p0", "p1")
    swapped = group_from_pairs(b.replace(policy_chosen_token_logps=tl, policy_rejected_token_logps=tw,
                                         chosen_token_entropies=hl, rejected_token_entropies=hw,
                                         chosen_mask=ml, rejected_mask=mw))  # fmt: skip
    assert swapped.policy_token_logps[:, 1].tolist() == [[-0.5, -0.5, 0.0], [-1.0, 0.0, 0.0]]  # the rejected padded


def test_a_field_only_one_response_has_is_left_out():
    z = torch.zeros(2, dtype=F)
    g = group_from_pairs(prefzoo.PreferenceBatch(z, z, ref_chosen_logps=z, chosen_lengths=torch.tensor([1, 2])))
    assert g.ref_logps is None and g.lengths is None and g.policy_token_logps is None
    t = torch.zeros(2, 3, dtype=F)  # token-level fields of the chosen response only
    g = group_from_pairs(prefzoo.PreferenceBatch(z, z, policy_chosen_token_logps=t, chosen_token_entropies=t,
                                                 chosen_mask=torch.ones(2, 3, dtype=torch.bool)))  # fmt: skip
    assert g.policy_token_logps is None and g.token_entropies is None and g.token_mask is None
