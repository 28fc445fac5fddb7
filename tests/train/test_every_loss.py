"""Every registered loss trains through the same loop; the loop never names a loss."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from helpers import base_config, params_of, run_inprocess

import prefzoo.train as train_pkg
from prefzoo.registry import list_losses


def test_trainer_source_names_no_loss():
    root = Path(train_pkg.__file__).parent
    names = list_losses()
    for path in sorted(root.glob("*.py")):
        if path.name == "config.py":  # holds the documented default loss (a value, not a branch)
            continue
        text = path.read_text()
        for name in names:
            assert not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), f"{path.name} names loss {name!r}"


def test_source_check_would_catch_a_branch():
    text = 'if cfg.loss == "dpo":\n    pass\n'
    assert re.search(r"(?<![\w-])dpo(?![\w-])", text)


@pytest.mark.parametrize("loss_name", list_losses())
def test_loss_trains_a_few_steps(tmp_path, tiny_dir, pairs_file, loss_name):
    from transformers import AutoModelForCausalLM

    before = params_of(AutoModelForCausalLM.from_pretrained(tiny_dir))
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path, loss=loss_name, max_steps=2, lr=1e-2))
    assert res.global_step == 2
    assert all(math.isfinite(h["loss"]) for h in res.history)
    after = params_of(res.model)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before), f"{loss_name}: parameters not updated: {set(before) - set(changed)}"
    assert (tmp_path / "final" / "run_card.json").is_file()
