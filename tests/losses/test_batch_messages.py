"""The batches' one-line errors matched whole, field by field, for the cases a complete mutation run of
prefzoo/types.py found unmatched (test_shapes.py matches a part of each; test_batch_errors.py the pair batch's first
checks): every word of a message is what a user reads to fix the input, so each is pinned here."""

from __future__ import annotations

import pytest
import torch

from prefzoo.types import GroupBatch, LossContext, PreferenceBatch, UnpairedBatch, error_summary
from tests.losses.test_batch_errors import _pair, _raises

F = torch.float64
NAN, INF = float("nan"), float("inf")


def _group(**kw) -> GroupBatch:
    return GroupBatch(**{"policy_logps": torch.zeros(1, 2, dtype=F), **kw})


def _unpaired(**kw) -> UnpairedBatch:
    return UnpairedBatch(**{"policy_logps": torch.zeros(2, dtype=F), "labels": torch.tensor([True, False]), **kw})


TOK = torch.zeros(1, 2, 3, dtype=F)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: PreferenceBatch(torch.zeros(0), torch.zeros(0)),
         "PreferenceBatch.policy_chosen_logps must have shape (B,) with B >= 1 (one summed log-prob per pair), got "
         "shape (0,)"),
        (lambda: PreferenceBatch(torch.zeros(5), torch.zeros(5), chosen_lengths=torch.full((5,), 2.5)),
         "PreferenceBatch.chosen_lengths must hold whole token counts (an integer tensor), got torch.float32 values "
         "[2.5, 2.5, 2.5, 2.5]; pass completion_mask.sum(-1)"),
        (lambda: _pair(rejected_lengths=torch.tensor([1, 0])),
         "PreferenceBatch.rejected_lengths[1] = 0: completion lengths must be positive token counts; drop pairs whose "
         "completion was truncated away"),
        (lambda: _pair(ref_chosen_logps=torch.tensor([0.0, INF], dtype=F)),
         "PreferenceBatch.ref_chosen_logps[1] is inf: log-probs and entropies must be finite; check the model's "
         "outputs and the completion mask"),
        (lambda: _pair(policy_chosen_token_logps=torch.tensor([[0.0], [NAN]], dtype=F), example_ids=("p", "q")),
         "PreferenceBatch.policy_chosen_token_logps[1] (example 'q') is nan: log-probs and entropies must be finite; "
         "check the model's outputs and the completion mask"),
    ],
    ids=["empty", "four-values-shown", "first-non-positive-length", "no-ids", "token-level-with-id"],
)  # fmt: skip
def test_pair_batch_messages_whole(build, message):
    _raises(message, build)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: GroupBatch(policy_logps=torch.zeros(0, 2)),
         "GroupBatch.policy_logps must have shape (G, K) with G >= 1 groups and K >= 2 completions, got (0, 2)"),
        (lambda: GroupBatch(policy_logps=[[0.0, 0.0]]),
         "GroupBatch.policy_logps must have shape (G, K) with G >= 1 groups and K >= 2 completions, got list"),
        (lambda: _group(mask=torch.ones(1, 2, dtype=torch.long)),
         "GroupBatch.mask must be a bool tensor (True on real entries), got torch.int64"),
        (lambda: _group(mask=torch.ones(1, 3, dtype=torch.bool)),
         "GroupBatch.mask has shape (1, 3) but policy_logps implies (1, 2) (G, K)"),
        (lambda: _group(mask=torch.tensor([[True, False]]), example_ids=("g0",)),
         "GroupBatch.mask[0] (example 'g0') leaves 1 completion(s): a group needs at least two; drop it or pair it"),
        (lambda: _group(ref_logps=torch.tensor([[0.0, NAN]], dtype=F)),
         "GroupBatch.ref_logps[0, 1] is nan: values must be finite; put a finite filler (0) in padding slots and mark "
         "them in mask"),
        (lambda: _group(lengths=torch.tensor([[2, 0]]), mask=torch.tensor([[True, True]])),
         "GroupBatch.lengths[0, 1] = 0: completion lengths must be positive token counts"),
        (lambda: _group(lengths=torch.tensor([[2.0, INF]])),
         "GroupBatch.lengths must hold whole token counts (an integer tensor), got torch.float32"),
        (lambda: _group(policy_token_logps=torch.zeros(1, 3, 4, dtype=F)),
         "GroupBatch.policy_token_logps must have shape (G, K, T) with (G, K) = (1, 2), got (1, 3, 4)"),
        (lambda: _group(policy_token_logps=TOK, token_mask=torch.ones(1, 2, 4, dtype=torch.bool)),
         "GroupBatch.token_mask has shape (1, 2, 4) but policy_logps implies (1, 2, 3) (G, K, T)"),
        (lambda: _group(policy_token_logps=TOK, token_mask=torch.ones(1, 2, 3, dtype=torch.long)),
         "GroupBatch.token_mask must be a bool tensor (True on real entries), got torch.int64"),
        (lambda: _group(token_entropies=torch.tensor([[[0.0], [INF]]], dtype=F)),
         "GroupBatch.token_entropies[0, 1, 0] is inf: values must be finite"),
        (lambda: _group(token_entropies=torch.zeros(1, 2, 3, dtype=F, device="meta")),
         "GroupBatch.token_entropies is on meta but policy_logps is on cpu: move it with .to()"),
    ],
    ids=["no-groups", "not-a-tensor", "int-mask", "mask-shape", "one-left-with-id", "non-finite-filler",
         "zero-length-on-a-real-slot", "infinite-length", "token-lead", "token-length", "int-token-mask",
         "token-non-finite", "token-device"],
)  # fmt: skip
def test_group_batch_messages_whole(build, message):
    _raises(message, build)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: _unpaired(labels=torch.tensor([1, 0])),
         "UnpairedBatch.labels must be a bool tensor (True = desirable, False = undesirable), got torch.int64"),
        (lambda: _unpaired(ref_logps=torch.zeros(3, dtype=F)),
         "UnpairedBatch.ref_logps has shape (3,) but policy_logps implies (2,) (N,)"),
        (lambda: _unpaired(ref_logps=torch.tensor([0.0, -INF], dtype=F)),
         "UnpairedBatch.ref_logps[1] is -inf: values must be finite"),
        (lambda: _unpaired(density_ratio_weights=torch.tensor([0.0, -1.0], dtype=F)),
         "UnpairedBatch.density_ratio_weights[1] is negative: density-ratio weights are >= 0"),
        (lambda: _unpaired(policy_token_logps=torch.zeros(2, 3, dtype=F), token_mask=torch.ones(2, 3)),
         "UnpairedBatch.token_mask must be a bool tensor (True on real entries), got torch.float32"),
        (lambda: _unpaired(policy_token_logps=torch.zeros(3, 3, dtype=F)),
         "UnpairedBatch.policy_token_logps must have shape (N, T) with N = 2, got (3, 3)"),
    ],
    ids=["int-labels", "field-shape", "non-finite", "first-negative-weight", "token-mask-dtype", "token-lead"],
)  # fmt: skip
def test_unpaired_batch_messages_whole(build, message):
    _raises(message, build)


def test_whole_float_lengths_and_boundary_values_are_accepted():
    """The edges of each check: whole float counts, a length of one, a zero length on a padding slot, a zero
    density-ratio weight are all valid input."""
    assert _group(lengths=torch.tensor([[2.0, 1.0]])).lengths.tolist() == [[2.0, 1.0]]
    assert _group(lengths=torch.tensor([[1, 1]]), mask=torch.tensor([[True, True]])).lengths.tolist() == [[1, 1]]
    three = GroupBatch(policy_logps=torch.zeros(1, 3), lengths=torch.tensor([[1, 1, 0]]),
                       mask=torch.tensor([[True, True, False]]))  # fmt: skip
    assert three.valid.tolist() == [[True, True, False]]
    assert _unpaired(lengths=torch.tensor([1.0, 3.0])).lengths.tolist() == [1.0, 3.0]
    assert _unpaired(density_ratio_weights=torch.tensor([0.0, 2.0])).density_ratio_weights.tolist() == [0.0, 2.0]
    assert _pair(chosen_lengths=torch.tensor([1, 2])).chosen_lengths.tolist() == [1, 2]


def test_error_summary_cuts_at_300_characters_by_default():
    assert error_summary(ValueError("x" * 400)) == "ValueError: " + "x" * 300


class _Rows:
    """A two-process gather seen from the second process, which holds 3 examples: the first holds 5, with token 0."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.seen: list[tuple[torch.device, torch.dtype]] = []

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        self.seen.append((t.device, t.dtype))
        return torch.tensor([[5, 0], [3, self.token]])


def test_offset_gathers_its_size_and_token_on_the_device_asked_for(monkeypatch):
    monkeypatch.setattr("prefzoo.types.os.urandom", lambda n: b"\x07" * n)  # a token that reads alike both ways
    rows = _Rows(int.from_bytes(b"\x07" * 7, "little"))
    ctx = LossContext(gather=rows)
    assert ctx.offset(3) == 5
    ctx.offset(3, device="meta")
    assert rows.seen == [(torch.device("cpu"), torch.int64), (torch.device("meta"), torch.int64)]
