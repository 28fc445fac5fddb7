"""The kit's simulated ranks (prefzoo.testing.sharding): a whole batch is split by ``sizes`` before the threads run."""

from __future__ import annotations

import threading

import pytest
import torch

import prefzoo
from prefzoo.testing.sharding import run_sharded, run_threads, shard_batch, split_sizes


def _batch() -> prefzoo.PreferenceBatch:
    f = torch.float64
    return prefzoo.PreferenceBatch(
        torch.tensor([-1.0, -2.0, -3.0, -4.0], dtype=f), torch.tensor([-5.0, -6.0, -7.0, -8.0], dtype=f),
        torch.tensor([-1.5, -2.5, -3.5, -4.5], dtype=f), torch.tensor([-5.5, -6.5, -7.5, -8.5], dtype=f),
    )  # fmt: skip


def test_a_whole_batch_is_split_by_sizes_and_each_rank_gathers_all_of_it():
    seen: list[tuple[int, list[float]]] = []

    def on_rank(shard: prefzoo.PreferenceBatch, gather) -> list[float]:
        every = gather(shard.policy_chosen_logps)
        seen.append((shard.batch_size, every.tolist()))
        return shard.policy_chosen_logps.tolist()

    outs = run_sharded(on_rank, _batch(), sizes=[1, 3])
    assert outs == [[-1.0], [-2.0, -3.0, -4.0]]  # in rank order, split as asked
    assert sorted(seen) == [(1, [-1.0, -2.0, -3.0, -4.0]), (3, [-1.0, -2.0, -3.0, -4.0])]


def test_a_whole_batch_without_sizes_is_one_rank_and_equals_the_unsharded_loss():
    spec = prefzoo.loss_spec("mmpo")  # batch-coupled: its min-max normalisation reads the gathered batch
    loss = prefzoo.Loss(spec, spec.params(beta=0.5))
    whole = loss(_batch())
    (alone,) = run_sharded(lambda sh, gather: loss(sh, gather=gather), _batch())
    assert torch.equal(alone.losses, whole.losses)
    two = run_sharded(lambda sh, gather: loss(sh, gather=gather), _batch(), sizes=split_sizes(4, 2))
    by_hand = run_sharded(lambda sh, gather: loss(sh, gather=gather), shard_batch(_batch(), [1, 3]))
    assert split_sizes(4, 2) == [1, 3]
    assert all(torch.equal(a.losses, b.losses) for a, b in zip(two, by_hand, strict=True))
    assert torch.allclose(torch.cat([o.chosen_rewards for o in two]), whole.chosen_rewards, atol=1e-12, rtol=0)


def test_example_ids_are_split_with_their_pairs():
    b = _batch().replace()
    b = prefzoo.PreferenceBatch(b.policy_chosen_logps, b.policy_rejected_logps, example_ids=("a", "b", "c", "d"))
    parts = shard_batch(b, [1, 3])
    assert [p.example_ids for p in parts] == [("a",), ("b", "c", "d")]
    assert [p.policy_chosen_logps.tolist() for p in parts] == [[-1.0], [-2.0, -3.0, -4.0]]


def test_a_rank_that_raises_is_reported_not_the_barrier_it_broke():
    def on_rank(shard: prefzoo.PreferenceBatch, gather) -> None:
        if shard.batch_size == 1:
            raise ValueError("rank 0 failed")
        gather(shard.policy_chosen_logps)  # rank 1 waits here until rank 0's failure breaks the barrier

    with pytest.raises(ValueError, match=r"^rank 0 failed$"):
        run_sharded(on_rank, _batch(), sizes=[1, 3])


def test_a_broken_barrier_with_no_other_error_still_fails_the_run():
    """A barrier that breaks with no rank raising anything else (its 30 s timeout, or an abort) is raised, not
    swallowed into a list of missing results."""

    def abort(rank, ex):
        ex.barrier.abort()
        ex.barrier.wait()

    with pytest.raises(threading.BrokenBarrierError):
        run_threads(abort, 2)


def test_each_rank_finds_its_offset_in_the_gathered_batch():
    from prefzoo.types import LossContext

    def on_rank(shard: prefzoo.PreferenceBatch, gather) -> int:
        return LossContext(gather=gather).offset(shard.batch_size)

    assert run_sharded(on_rank, _batch(), sizes=[1, 2, 1]) == [0, 1, 3]
    assert LossContext().offset(5) == 0  # one process: no gather, no offset


def test_the_offset_token_is_made_on_the_device_asked_for_not_the_default_one():
    from prefzoo.types import LossContext

    seen = []

    def gather(t: torch.Tensor) -> torch.Tensor:
        seen.append(t.device.type)
        return t

    with torch.device("meta"):  # a default device other than the one asked for
        assert LossContext(gather=gather).offset(4, device="cpu") == 0
    assert seen == ["cpu"]
