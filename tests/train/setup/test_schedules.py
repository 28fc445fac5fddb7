"""prefzoo's schedules are transformers' (same learning rates, same state), and building one imports no peft."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prefzoo.train.config import LR_SCHEDULERS
from prefzoo.train.setup.schedules import SCHEDULES, get_schedule

transformers = pytest.importorskip("transformers")


def _optimizer(lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def _lrs(sched: object, opt: torch.optim.Optimizer, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr()[0])  # type: ignore[attr-defined]
        opt.step()
        sched.step()  # type: ignore[attr-defined]
    return out


def test_the_names_are_the_configs():
    assert SCHEDULES == LR_SCHEDULERS


@pytest.mark.parametrize("name", SCHEDULES)
@settings(max_examples=25, deadline=None)
@given(total=st.integers(1, 120), warmup=st.integers(0, 130), lr=st.sampled_from([1.0, 3e-4, 5e-7, 2e-5]))
def test_every_schedule_gives_transformers_learning_rates_exactly(name, total, warmup, lr):
    if name == "polynomial" and warmup >= total:
        warmup = total - 1  # transformers divides by zero there: the test below
    theirs_opt, ours_opt = _optimizer(lr), _optimizer(lr)
    theirs = transformers.get_scheduler(name, theirs_opt, num_warmup_steps=warmup, num_training_steps=total)
    ours = get_schedule(name, ours_opt, num_warmup_steps=warmup, num_training_steps=total)
    steps = total + 3  # past the end too (polynomial's lr_end, cosine's floor)
    assert _lrs(ours, ours_opt, steps) == _lrs(theirs, theirs_opt, steps)  # bit for bit, not approximately
    assert ours.state_dict() == theirs.state_dict()


@pytest.mark.parametrize("name", ["cosine", "polynomial", "inverse_sqrt", "constant"])
def test_a_state_saved_by_either_resumes_in_the_other(name):
    """A checkpoint's scheduler state from a transformers-built schedule (prefzoo before) resumes here, and back."""
    theirs = transformers.get_scheduler
    for make_first, make_second in ((theirs, get_schedule), (get_schedule, theirs)):
        opt = _optimizer(1e-3)
        first = make_first(name, opt, num_warmup_steps=3, num_training_steps=20)
        head = _lrs(first, opt, 7)
        state = first.state_dict()
        opt2 = _optimizer(1e-3)
        opt2.load_state_dict(opt.state_dict())
        second = make_second(name, opt2, num_warmup_steps=3, num_training_steps=20)
        second.load_state_dict(state)
        whole_opt = _optimizer(1e-3)
        whole = transformers.get_scheduler(name, whole_opt, num_warmup_steps=3, num_training_steps=20)
        assert head + _lrs(second, opt2, 13) == _lrs(whole, whole_opt, 20)


@pytest.mark.parametrize("total", [1, 5])
def test_a_polynomial_decay_whose_warmup_fills_the_run_ends_at_lr_end(total):
    """transformers raises ZeroDivisionError after the run's last step; here the last step's factor is lr_end."""
    opt = _optimizer(1e-3)
    theirs = transformers.get_scheduler("polynomial", opt, num_warmup_steps=total, num_training_steps=total)
    with pytest.raises(ZeroDivisionError):
        _lrs(theirs, opt, total + 1)
    opt = _optimizer(1e-3)
    lrs = _lrs(get_schedule("polynomial", opt, total, total), opt, total + 2)
    assert lrs[:total] == [1e-3 * (k / total) for k in range(total)]  # LambdaLR: base lr × factor
    assert lrs[total:] == [1e-7, 1e-7]


def test_a_polynomial_schedule_below_its_end_names_the_fix():
    with pytest.raises(ValueError, match=r"lr=5e-08: the polynomial schedule decays to 1e-7; choose a larger --lr"):
        get_schedule("polynomial", _optimizer(5e-8), 0, 10)


def test_an_unknown_name_is_refused():
    with pytest.raises(ValueError, match="lr_scheduler_type='wsd': choose cosine, linear"):
        get_schedule("wsd", _optimizer(1e-3), 0, 10)


def test_a_run_without_lora_imports_no_peft_and_no_bitsandbytes(tiny_dir, pairs_file, tmp_path):
    """transformers.optimization imports transformers.trainer_utils, and that peft and bitsandbytes: +64 MB of peak
    RSS and 2-4 s of start measured on the benchmark's run.  Nothing on a full fine-tuning run's path may load them."""
    child = (
        "import json, sys\n"
        "from prefzoo.train import Callback, TrainConfig, train\n"
        "seen = []\n"
        "class Look(Callback):\n"
        "    def on_step_begin(self, state):\n"
        "        seen.append(sorted(m for m in ('peft', 'bitsandbytes', 'transformers.trainer_utils',\n"
        "                                       'transformers.optimization') if m in sys.modules))\n"
        f"cfg = TrainConfig(model={str(tiny_dir)!r}, dataset={str(pairs_file)!r}, loss='dpo', max_steps=1,\n"
        f"                  output_dir={str(tmp_path / 'out')!r}, progress=False, report_to='none',\n"
        "                  eval_fraction=0.0, warmup_ratio=0.1)\n"
        "train(cfg, callbacks=[Look()])\n"
        "print(json.dumps(seen))\n"
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [[]], proc.stdout[-2000:]
