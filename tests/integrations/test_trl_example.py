"""The TRL examples run offline (--tiny): MMPO in DPOTrainer, BCO in KTOTrainer, the loss's metrics beside TRL's."""

from __future__ import annotations

import runpy
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_dpo_mmpo.py"


def test_the_example_trains_mmpo_offline(tmp_path):
    example = runpy.run_path(str(EXAMPLE))  # the __main__ guard keeps it from running on load
    trainer = example["main"](["--tiny", "--max-steps", "2", "--output-dir", str(tmp_path / "out")])
    assert trainer.prefzoo_loss.name == "mmpo"
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2 and all("mmpo/weight_chosen" in e and "rewards/margins" in e for e in logged)
    assert (tmp_path / "out" / "model.safetensors").is_file()


KTO_EXAMPLE = EXAMPLE.with_name("trl_kto.py")


def test_the_kto_example_trains_bco_offline(tmp_path):
    example = runpy.run_path(str(KTO_EXAMPLE))
    trainer = example["main"](["--tiny", "--max-steps", "2", "--output-dir", str(tmp_path / "out")])
    assert trainer.prefzoo_loss.name == "bco"
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2 and all("bco/delta" in e and "rewards/chosen" in e and "kl" in e for e in logged)
    assert float(trainer.prefzoo_loss.state["count"]) == 8  # δ is the running mean of 2 steps × 4 rewards
    assert (tmp_path / "out" / "model.safetensors").is_file()
