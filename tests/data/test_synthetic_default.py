"""load_default_task: the contract the trainer codes against, caching, and (slow) that the task is a useful one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

from prefzoo.data import default as D
from prefzoo.eval.default_task import evaluate_policy
from prefzoo.model import default_policy as P

TINY = D.WarmupConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, steps=8, batch_size=16)


@pytest.fixture(scope="module")
def tiny_task(tmp_path_factory):
    return P.load_default_task(cache_dir=tmp_path_factory.mktemp("cache"), seed=0, warmup=TINY)


def test_contract(tiny_task) -> None:
    t = tiny_task
    assert isinstance(t.model_dir, Path) and (t.model_dir / "config.json").is_file()
    assert (t.model_dir / "tokenizer.json").is_file()
    for ds in (t.train, t.eval):
        assert ds.column_names == ["id", "prompt", "chosen", "rejected"]
        assert all(isinstance(v, str) for v in ds[0].values())
    assert len(t.train) == 600 and len(t.eval) == 200
    assert set(t.heldout_prompts).isdisjoint(set(t.train["prompt"]) | set(t.eval["prompt"]))
    assert set(t.recommended) == {
        "epochs", "per_device_batch_size", "grad_accum", "lr", "max_prompt_length", "max_completion_length",
        "warmup_ratio",
    }  # fmt: skip
    tok = t.load_tokenizer()
    assert tok.pad_token_id is not None and tok.eos_token_id is not None
    longest = max(len(tok(p).input_ids) for p in t.train["prompt"])
    assert longest <= t.recommended["max_prompt_length"]


def test_cached_second_call_does_not_rebuild(tiny_task, monkeypatch) -> None:
    def boom(*a, **k):
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(P, "warm_up", boom)
    again = P.load_default_task(cache_dir=tiny_task.model_dir.parent, seed=0, warmup=TINY)
    assert again.model_dir == tiny_task.model_dir
    assert again.train["chosen"] == tiny_task.train["chosen"]  # pairs are regenerated identically


def test_cache_dir_from_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(D.CACHE_ENV, str(tmp_path))
    assert D.cache_root() == tmp_path
    monkeypatch.delenv(D.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert D.cache_root() == tmp_path / "xdg" / "prefzoo"  # the XDG base directory convention, like HF and torch
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert D.cache_root() == Path.home() / ".cache" / "prefzoo"


def test_failed_build_leaves_no_cache(tmp_path, monkeypatch) -> None:
    def fail(*a, **k):
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(P, "warm_up", fail)
    with pytest.raises(RuntimeError):
        P.load_default_task(cache_dir=tmp_path, warmup=TINY)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]


def test_evaluate_policy_against_itself_is_all_ties(tiny_task) -> None:
    m, tok = tiny_task.load_model(), tiny_task.load_tokenizer()
    res = evaluate_policy(tiny_task, m, tok, m)
    assert res["win_rate"] == 0.5 and res["ties"] == res["n"] == len(tiny_task.heldout_prompts)
    assert res["retention"] == res["baseline_retention"]
    for k in ("win_rate", "ties", "retention", "lc_win_rate", "addition_accuracy"):
        assert isinstance(res[k], float)


def test_warmup_is_deterministic(tmp_path) -> None:
    import torch

    a = P.load_default_task(cache_dir=tmp_path / "a", warmup=TINY).load_model()
    b = P.load_default_task(cache_dir=tmp_path / "b", warmup=TINY).load_model()
    for (n, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q), n


def _summed_logps(model, tok, prompts, completions):
    import torch

    seqs, starts = [], []
    for p, c in zip(prompts, completions, strict=True):
        pi, ci = tok(p).input_ids, [*tok(c, add_special_tokens=False).input_ids, tok.eos_token_id]
        seqs.append(pi + ci)
        starts.append(len(pi))
    T = max(map(len, seqs))
    ids = torch.zeros(len(seqs), T, dtype=torch.long)  # (B, T)
    mask = torch.zeros_like(ids)  # (B, T)
    cmask = torch.zeros(len(seqs), T - 1)  # (B, T-1) predicts a completion token
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        cmask[i, starts[i] - 1 : len(s) - 1] = 1
    logp = model(input_ids=ids, attention_mask=mask).logits[:, :-1].log_softmax(-1)  # (B, T-1, V)
    tok_lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    return (tok_lp * cmask).sum(-1), cmask.sum(-1).long()  # (B,), (B,)


def preference_train(task, loss_name: str, lr: float = 2e-4, batch: int = 8, seed: int = 0):
    """A throwaway preference loop (constant lr, AdamW, one epoch) independent of prefzoo.train."""
    import torch

    import prefzoo

    torch.manual_seed(seed)
    tok, policy, ref = task.load_tokenizer(), task.load_model(), task.load_model()
    loss = prefzoo.get_loss(loss_name)
    opt = torch.optim.AdamW(policy.parameters(), lr=lr)
    policy.train()
    order = torch.randperm(len(task.train)).tolist()
    for s in range(0, len(order), batch):
        rows = task.train.select(order[s : s + batch])
        pc, lc = _summed_logps(policy, tok, rows["prompt"], rows["chosen"])
        pr, lr_ = _summed_logps(policy, tok, rows["prompt"], rows["rejected"])
        with torch.no_grad():
            rc, _ = _summed_logps(ref, tok, rows["prompt"], rows["chosen"])
            rr, _ = _summed_logps(ref, tok, rows["prompt"], rows["rejected"])
        pb = prefzoo.PreferenceBatch(
            policy_chosen_logps=pc, policy_rejected_logps=pr, ref_chosen_logps=rc, ref_rejected_logps=rr,
            chosen_lengths=lc, rejected_lengths=lr_, example_ids=tuple(rows["id"]),
        )  # fmt: skip
        opt.zero_grad()
        loss(pb).losses.mean().backward()
        opt.step()
    return policy.eval(), tok


@pytest.mark.slow
def test_real_default_task_is_imperfect_on_addition_and_good_at_reversal() -> None:
    t = P.load_default_task()  # the real one: built once (~45 s on 2 cores), then cached
    m, tok = t.load_model(), t.load_tokenizer()
    res = evaluate_policy(t, m, tok, m)
    assert 0.15 < res["addition_accuracy"] < 0.6, res
    assert res["retention"] >= 0.9, res


@pytest.mark.slow
@pytest.mark.parametrize("loss_name", ["mmpo", "dpo"])
def test_preference_training_improves_the_oracle_win_rate(loss_name: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t = P.load_default_task()
    policy, tok = preference_train(t, loss_name, lr=1e-4 if loss_name == "dpo" else 2e-4)
    res = evaluate_policy(t, policy, tok)
    assert res["win_rate"] > 0.55, res
    assert res["addition_accuracy"] > res["baseline_addition_accuracy"], res


def test_starting_policy_completions_are_cached_per_prompt_set(tiny_task) -> None:
    import dataclasses

    m, tok = tiny_task.load_model(), tiny_task.load_tokenizer()
    full = evaluate_policy(tiny_task, m, tok)
    assert full["n"] == 200 and len(tiny_task._start_cache) == 1
    small = dataclasses.replace(tiny_task, heldout_prompts=tiny_task.heldout_prompts[:10])
    assert small._start_cache == {}
    res = evaluate_policy(small, m, tok)
    assert res["n"] == 10 and res["win_rate"] == 0.5
