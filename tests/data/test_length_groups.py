"""Length-grouped sampling is a seeded permutation that pads less; the fast-path options train like the plain path."""

from __future__ import annotations

import random

import pytest

from prefzoo.data.length_groups import LengthGroupedSampler
from prefzoo.model.fast.choice import padding_fraction
from tests.train.helpers import base_config, max_param_diff, params_of, run_inprocess


def _lengths(n: int = 203, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(10, 500) for _ in range(n)]


def test_every_epoch_is_a_seeded_permutation():
    lengths = _lengths()
    s = LengthGroupedSampler(lengths, batch_size=4, seed=7)
    e0 = list(s)
    assert sorted(e0) == list(range(len(lengths)))
    assert list(s) == e0  # a pure function of (seed, epoch)
    s.set_epoch(1)
    e1 = list(s)
    assert sorted(e1) == sorted(e0) and e1 != e0
    assert list(LengthGroupedSampler(lengths, 4, seed=8)) != e0


def test_grouped_batches_pad_less_than_random_ones():
    lengths = _lengths()
    grouped = list(LengthGroupedSampler(lengths, batch_size=4, seed=0))
    shuffled = random.Random(0).sample(range(len(lengths)), len(lengths))

    def batches(order):
        return [[lengths[i] for i in order[k : k + 4]] for k in range(0, len(order), 4)]

    assert padding_fraction(batches(grouped)) < 0.5 * padding_fraction(batches(shuffled))
    assert len(batches(grouped)[-1]) == len(lengths) % 4  # the short batch stays last


def test_padding_fraction_by_hand():
    assert padding_fraction([[3, 1], [2, 2]]) == pytest.approx(1 - 8 / 10)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="batch_size=0"):
        LengthGroupedSampler([1, 2], batch_size=0)


@pytest.mark.parametrize(
    "option",
    [{"share_prompt": True}, {"fused_head": False}, {"group_by_length": True}, {"packing": True},
     {"packing": True, "share_prompt": True, "loss": "mmpo-entropy"}],
)  # fmt: skip
def test_trainer_options_train_like_the_default(tmp_path, tiny_dir, pairs_file, option):
    kw = dict(loss="dpo", max_steps=2, per_device_batch_size=64)  # one batch holds every pair: same data per step
    kw.update(dict.fromkeys(("share_prompt", "packing", "group_by_length"), "off"))  # the plain path, not "auto"
    option = dict(option)
    kw["loss"] = option.pop("loss", kw["loss"])
    plain = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "plain", **kw))
    fast = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "fast", **{**kw, **option}))
    assert [round(h["loss"], 4) for h in fast.history] == [round(h["loss"], 4) for h in plain.history]
    assert max_param_diff(params_of(fast.model), params_of(plain.model)) < 1e-4
