"""The batches' one-line errors (prefzoo/types.py), each matched whole: what is wrong, in which field, and the fix."""

from __future__ import annotations

import pytest
import torch

from prefzoo.types import GroupBatch, PreferenceBatch, PreferenceBatchError, UnpairedBatch, error_summary

F = torch.float64


def _pair(**kw) -> PreferenceBatch:
    z = torch.zeros(2, dtype=F)
    return PreferenceBatch(**{"policy_chosen_logps": z, "policy_rejected_logps": z, **kw})


def _raises(message: str, build) -> None:
    with pytest.raises(PreferenceBatchError) as e:
        build()
    assert str(e.value) == message


def test_the_batch_size_comes_from_a_tensor():
    _raises("PreferenceBatch.policy_chosen_logps must be a torch.Tensor of shape (B,), got list",
            lambda: PreferenceBatch([0.0, 0.0], torch.zeros(2)))  # fmt: skip


def test_both_policy_log_probs_are_required():
    _raises("PreferenceBatch.policy_rejected_logps is required", lambda: _pair(policy_rejected_logps=None))


def test_a_per_pair_field_must_be_a_tensor():
    _raises("PreferenceBatch.ref_chosen_logps must be a torch.Tensor, got list", lambda: _pair(ref_chosen_logps=[0, 0]))


def test_float_lengths_are_accepted_only_as_whole_counts():
    assert _pair(chosen_lengths=torch.tensor([2.0, 3.0])).chosen_lengths.tolist() == [2.0, 3.0]
    _raises("PreferenceBatch.chosen_lengths must hold whole token counts (an integer tensor), got torch.float32 values "
            "[2.5, 3.0]; pass completion_mask.sum(-1)",
            lambda: _pair(chosen_lengths=torch.tensor([2.5, 3.0])))  # fmt: skip
    _raises("PreferenceBatch.chosen_lengths must hold whole token counts (an integer tensor), got torch.float32 values "
            "[inf, 3.0]; pass completion_mask.sum(-1)",
            lambda: _pair(chosen_lengths=torch.tensor([float("inf"), 3.0])))  # fmt: skip


def test_token_level_fields_are_b_by_t_and_agree_within_a_response():
    tok = torch.zeros(2, 3, dtype=F)
    _raises("PreferenceBatch.policy_chosen_token_logps must have shape (B, T) with B = 2, got (2,)",
            lambda: _pair(policy_chosen_token_logps=torch.zeros(2, dtype=F)))  # fmt: skip
    _raises("PreferenceBatch.policy_chosen_token_logps must have shape (B, T) with B = 2, got (3, 3)",
            lambda: _pair(policy_chosen_token_logps=torch.zeros(3, 3, dtype=F)))  # fmt: skip
    _raises("PreferenceBatch.chosen_mask has shape (2, 4) but policy_chosen_token_logps and friends have (2, 3)",
            lambda: _pair(policy_chosen_token_logps=tok, chosen_mask=torch.ones(2, 4, dtype=torch.bool)))  # fmt: skip
    _raises("PreferenceBatch.chosen_mask must be a bool tensor, got torch.int64",
            lambda: _pair(policy_chosen_token_logps=tok, chosen_mask=torch.ones(2, 3, dtype=torch.long)))  # fmt: skip
    ok = _pair(policy_chosen_token_logps=tok, chosen_mask=torch.ones(2, 3, dtype=torch.bool),
               policy_rejected_token_logps=torch.zeros(2, 5, dtype=F))  # fmt: skip
    assert ok.policy_rejected_token_logps.shape == (2, 5)  # the two responses' lengths are independent


def test_a_field_on_another_device_is_named_with_the_fix():
    _raises("PreferenceBatch.ref_chosen_logps is on meta but policy_chosen_logps is on cpu: move it with .to()",
            lambda: _pair(ref_chosen_logps=torch.zeros(2, dtype=F, device="meta")))  # fmt: skip
    _raises("PreferenceBatch.chosen_token_entropies is on meta but policy_chosen_logps is on cpu",
            lambda: _pair(chosen_token_entropies=torch.zeros(2, 3, dtype=F, device="meta")))  # fmt: skip
    z = torch.zeros(2, 3, dtype=F)
    _raises("GroupBatch.ref_logps is on meta but policy_logps is on cpu: move it with .to()",
            lambda: GroupBatch(policy_logps=z, ref_logps=torch.zeros(2, 3, dtype=F, device="meta")))  # fmt: skip


def test_one_id_per_pair():
    _raises("PreferenceBatch.example_ids has 3 ids for B = 2", lambda: _pair(example_ids=("a", "b", "c")))


def test_group_and_unpaired_fields_must_be_tensors():
    z = torch.zeros(2, 3, dtype=F)
    _raises("GroupBatch.ref_logps must be a torch.Tensor of shape (G, K), got list",
            lambda: GroupBatch(policy_logps=z, ref_logps=[[0.0] * 3] * 2))  # fmt: skip


def test_unpaired_examples_need_their_labels():
    _raises("UnpairedBatch.labels is required: one bool per completion, True = desirable",
            lambda: UnpairedBatch(policy_logps=torch.zeros(2, dtype=F), labels=None))  # fmt: skip


def test_has_reference_reads_the_reference_field():
    z, lab = torch.zeros(2, dtype=F), torch.tensor([True, False])
    assert UnpairedBatch(policy_logps=z, labels=lab, ref_logps=z).has_reference
    assert not UnpairedBatch(policy_logps=z, labels=lab).has_reference
    g = torch.zeros(2, 3, dtype=F)
    assert GroupBatch(policy_logps=g, ref_logps=g).has_reference and not GroupBatch(policy_logps=g).has_reference


def test_error_summary_is_the_type_and_the_first_line_cut_to_the_limit():
    assert error_summary(ValueError("first line\nsecond")) == "ValueError: first line"
    assert error_summary(KeyError("abcdef"), limit=3) == "KeyError: 'ab"
    assert error_summary(RuntimeError("")) == "RuntimeError: "
    padded = RuntimeError("  padded  \nx")  # the message is stripped, not its first line
    assert error_summary(padded) == "RuntimeError: padded  "


def test_a_pairwise_output_is_checked_against_the_batch_size_alone():
    from prefzoo.spec import LossOutputError, check_output
    from prefzoo.types import LossOutput

    z = torch.zeros(3, dtype=F)
    check_output("toy", "me", LossOutput(z, z, z), 3)  # B = 3 given as a number: one per pair
    with pytest.raises(LossOutputError) as e:
        check_output("toy", "me", LossOutput(torch.zeros(2, dtype=F), z, z), 3)
    assert str(e.value) == "loss 'toy' (plugin 'me') returned losses of shape (2,); expected (3,), one per pair"


def test_a_per_pair_field_of_another_batch_size_names_both_shapes():
    _raises("PreferenceBatch.policy_rejected_logps has shape (3,) but policy_chosen_logps has (2,): every per-example "
            "field must have one entry per pair", lambda: _pair(policy_rejected_logps=torch.zeros(3, dtype=F)))


def test_unpaired_policy_log_probs_of_the_wrong_shape_name_the_shape():
    lab = torch.tensor([True, False])
    _raises("UnpairedBatch.policy_logps must have shape (N,) with N >= 1 completions, got (2, 3)",
            lambda: UnpairedBatch(policy_logps=torch.zeros(2, 3, dtype=F), labels=lab))  # fmt: skip
    _raises("UnpairedBatch.policy_logps must have shape (N,) with N >= 1 completions, got list",
            lambda: UnpairedBatch(policy_logps=[0.0, 0.0], labels=lab))  # fmt: skip
