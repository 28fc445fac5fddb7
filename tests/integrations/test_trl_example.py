"""examples/trl_dpo_mmpo.py runs offline (--tiny) and trains with MMPO, logging MMPO's metrics beside TRL's."""

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
