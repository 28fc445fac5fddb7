"""Non-finite log-probs, losses or gradients skip the optimizer step (logged with example ids, counted, all ranks)."""

from __future__ import annotations

import json

import pytest
import torch

from prefzoo.train.loop.guard import NonFiniteStepsError, nonfinite_ids
from prefzoo.types import PreferenceBatch, PreferenceBatchError
from tests.faults._run import checkpoint_weights, max_diff
from tests.faults.injector import SPEC as INJECTOR
from tests.faults.injector import parse_faults
from tests.train.helpers import base_config, run_inprocess, run_processes

KW = dict(loss="dpo", per_device_batch_size=4, grad_accum=1, max_steps=5, eval_fraction=0.0, save_steps=1)
KW["callbacks"] = [INJECTOR]  # faults come from PREFZOO_FAULTS through this callback


def _events(out):
    lines = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines() if s.strip()]
    return [r for r in lines if r.get("event") == "skipped_step"], [r for r in lines if "skipped_steps" in r]


def _scheduler_epoch(ckpt) -> int:
    return int(torch.load(ckpt / "scheduler.bin", weights_only=True)["last_epoch"])


@pytest.mark.parametrize(("fault", "reason"), [("nan_logps@3", "log-probs or loss"), ("nan_grad@3", "gradient norm")])
def test_injected_nan_step_is_skipped_and_logged(tmp_path, tiny_dir, pairs_file, faults, capsys, fault, reason):
    faults(fault)
    out = tmp_path / "run"
    res = run_inprocess(base_config(tiny_dir, pairs_file, out, save_total_limit=10, **KW))
    assert res.global_step == 5 and res.skipped_steps == 1 and res.final_dir is not None
    skipped, metrics = _events(out)
    assert [s["step"] for s in skipped] == [3] and reason in skipped[0]["reason"]
    assert skipped[0]["example_ids"] and all(i.startswith("train:p") for i in skipped[0]["example_ids"])
    if fault.startswith("nan_logps"):
        assert len(skipped[0]["example_ids"]) == 1  # only the poisoned pair is named
    assert [m["skipped_steps"] for m in metrics] == [0, 0, 1, 1, 1]
    assert "step 3 skipped" in capsys.readouterr().err
    ck = {s: out / "checkpoints" / f"step-{s:08d}" for s in (2, 3, 4)}
    assert max_diff(checkpoint_weights(ck[2]), checkpoint_weights(ck[3])) == 0.0  # no optimizer update in step 3
    assert max_diff(checkpoint_weights(ck[3]), checkpoint_weights(ck[4])) > 0.0  # step 4 trains again
    assert _scheduler_epoch(ck[3]) == _scheduler_epoch(ck[2]) == 2  # and no scheduler step
    assert all(torch.isfinite(p).all() for p in res.model.parameters())


def test_nan_inside_gradient_accumulation_skips_the_whole_step(tmp_path, tiny_dir, pairs_file, faults):
    faults("nan_logps@2")
    out = tmp_path / "run"
    res = run_inprocess(base_config(tiny_dir, pairs_file, out, **{**KW, "grad_accum": 2, "max_steps": 3}))
    assert res.global_step == 3 and res.skipped_steps == 1
    assert [s["step"] for s in _events(out)[0]] == [2]


def test_consecutive_skips_stop_the_run_with_a_checkpoint(tmp_path, tiny_dir, pairs_file, faults):
    faults("nan_logps@0")  # every step
    out = tmp_path / "run"
    with pytest.raises(NonFiniteStepsError, match=r"3 optimizer steps in a row.*max-consecutive-skips") as e:
        run_inprocess(base_config(tiny_dir, pairs_file, out, **{**KW, "save_steps": 0}, max_consecutive_skips=3))
    ckpt = out / "checkpoints" / "step-00000003"
    assert str(ckpt) in str(e.value)
    from safetensors.torch import load_file

    start = load_file(str(tiny_dir / "model.safetensors"))
    saved = {k.removeprefix("lm."): v for k, v in checkpoint_weights(ckpt).items()}
    assert max_diff(start, saved) == 0.0  # the saved weights are the last finite ones: untouched


def test_model_produced_nan_never_reaches_preference_batch_but_user_batches_still_raise():
    with pytest.raises(PreferenceBatchError, match=r"policy_chosen_logps\[1\] \(example 'b'\) is nan"):
        PreferenceBatch(
            policy_chosen_logps=torch.tensor([-1.0, float("nan")]),
            policy_rejected_logps=torch.tensor([-2.0, -2.0]),
            example_ids=("a", "b"),
        )
    ids = ["a", "b", "c"]
    tok = torch.zeros(3, 4)
    tok[2, 1] = float("inf")
    assert nonfinite_ids(ids, torch.tensor([0.0, float("nan"), 0.0]), None, tok) == ["b", "c"]
    assert nonfinite_ids(ids, torch.zeros(3)) == []


def test_fault_plan_parsing(monkeypatch):
    from types import SimpleNamespace

    from tests.faults.injector import FaultInjector

    monkeypatch.setenv("PREFZOO_FAULTS", "nan_logps@3:1, exit@2")
    inj = FaultInjector()  # reads the variable when built

    def at(step: int, rank: int) -> SimpleNamespace:
        return SimpleNamespace(global_step=step - 1, accelerator=SimpleNamespace(process_index=rank))

    assert inj.fires("nan_logps", at(3, 1)) and not inj.fires("nan_logps", at(3, 0))
    assert not inj.fires("nan_logps", at(2, 1))
    assert inj.fires("exit", at(2, 0)) and inj.fires("exit", at(2, 5))
    monkeypatch.delenv("PREFZOO_FAULTS")
    assert not FaultInjector().faults
    with pytest.raises(ValueError, match="bad entry 'explode@1'"):
        parse_faults("explode@1")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("fault", ["nan_logps@2:1", "nan_grad@2:1"])
def test_one_ranks_nan_skips_the_step_on_every_rank(tmp_path, tiny_dir, pairs_file, monkeypatch, fault):
    monkeypatch.setenv("PREFZOO_FAULTS", fault)  # only rank 1 sees the NaN
    out = tmp_path / "two"
    # mmpo-no-aux gathers over ranks inside the loss: the ranks must agree before calling it
    cfg = base_config(tiny_dir, pairs_file, out, loss="mmpo-no-aux", per_device_batch_size=4, max_steps=4, save_steps=1)
    cfg["callbacks"] = [INJECTOR]
    cfg["save_total_limit"] = 10
    res = run_processes(cfg, 2, timeout=240)
    assert res["step"] == 4
    skipped, metrics = _events(out)
    assert [s["step"] for s in skipped] == [2]
    assert skipped[0]["example_ids"]
    assert metrics[-1]["skipped_steps"] == 1
    ck = {s: out / "checkpoints" / f"step-{s:08d}" for s in (1, 2)}
    assert max_diff(checkpoint_weights(ck[1]), checkpoint_weights(ck[2])) == 0.0
