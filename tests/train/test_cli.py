"""`prefzoo train`: every option documented, YAML + flag overrides, clear one-line errors before models load."""

from __future__ import annotations

import json
import sys

import pytest

from prefzoo.cli.main import main
from prefzoo.train.config import TrainConfig
from tests.support.tiny import make_model_dir, write_jsonl


def _err(capsys) -> str:
    return capsys.readouterr().err


def test_help_documents_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for key in TrainConfig.keys():
        renamed = {"loss_params": "--loss-param", "callbacks": "--callback", "modifiers": "--modifier"}
        flag = renamed.get(key, "--" + key.replace("_", "-"))
        assert flag in text, flag
    assert text.count("(default:") >= len(TrainConfig.keys())
    for required in (
        "--model",
        "--dataset",
        "--lr",
        "--epochs",
        "--max-steps",
        "--per-device-batch-size",
        "--grad-accum",
        "--lora",
        "--optim",
        "--deepspeed",
        "--precompute-ref",
        "--output-dir",
        "--seed",
        "--resume",
        "--config",
        "--max-prompt-length",
        "--max-completion-length",
    ):
        assert required in text


def test_bad_loss_param_fails_before_any_model_loads(capsys, tmp_path):
    rc = main(
        [
            "train",
            "--loss",
            "dpo",
            "--loss-param",
            "betta=0.1",
            "--model",
            str(tmp_path / "nope"),
            "--dataset",
            str(tmp_path / "nope.jsonl"),
        ]
    )
    err = _err(capsys)
    assert rc == 2 and "betta" in err and "nope" not in err
    rc = main(["train", "--loss", "dpo", "--loss-param", "beta=-1", "--model", "x", "--dataset", "y"])
    assert rc == 2 and "beta" in _err(capsys)


def test_unknown_loss_suggests_names(capsys):
    rc = main(["train", "--loss", "mmop", "--model", "x", "--dataset", "y"])
    err = _err(capsys)
    assert rc == 2 and "mmpo" in err and err.count("\n") == 1


def test_model_without_dataset_is_an_error(capsys):
    assert main(["train", "--model", "x"]) == 2
    assert "--dataset is not set" in _err(capsys)


def test_yaml_config_with_flag_override(tmp_path, tiny_dir, pairs_file, capsys):
    run = tmp_path / "run.yaml"
    run.write_text(
        f"loss: ipo\nmodel: {tiny_dir}\ndataset: {pairs_file}\nmax-steps: 5\nper_device_batch_size: 4\n"
        f"loss_params: {{beta: 0.2}}\nreport_to: none\nprogress: false\noutput_dir: {tmp_path / 'out'}\n"
    )
    rc = main(["train", "--config", str(run), "--max-steps", "2", "--grad-accum", "1"])
    assert rc == 0
    card = json.loads((tmp_path / "out" / "final" / "run_card.json").read_text())
    assert card["config"]["max_steps"] == 2  # flag beats YAML
    assert card["config"]["per_device_batch_size"] == 4  # YAML beats default
    assert card["config"]["loss_params"] == {"beta": 0.2}
    assert card["steps"] == 2


def test_unknown_yaml_key_is_named(tmp_path, capsys):
    run = tmp_path / "run.yaml"
    run.write_text("loss: dpo\nmodel: x\ndataset: y\nlerning_rate: 1e-3\n")  # TRL's learning_rate is an alias
    assert main(["train", "--config", str(run)]) == 2
    assert "'lerning_rate'" in _err(capsys)


def test_no_pad_token_uses_eos_and_says_so(tmp_path, pairs_file, capsys):
    model_dir = make_model_dir(tmp_path, pad=False)
    rc = main(
        [
            "train",
            "--loss",
            "simpo",
            "--model",
            str(model_dir),
            "--dataset",
            str(pairs_file),
            "--max-steps",
            "1",
            "--report-to",
            "none",
            "--no-progress",
            "--output-dir",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 0
    assert "no pad token: using its eos token" in capsys.readouterr().out


def test_every_pair_truncated_away_is_an_error(tmp_path, tiny_dir, capsys):
    data = write_jsonl(tmp_path / "empty.jsonl", [{"prompt": "a", "chosen": "", "rejected": " "}] * 3)
    out = str(tmp_path / "o")
    rc = main(["train", "--model", str(tiny_dir), "--dataset", str(data), "--report-to", "none", "--output-dir", out])
    assert rc == 2 and "all 3 pairs were dropped" in _err(capsys)


def test_bad_lora_targets_are_named(tmp_path, tiny_dir, pairs_file, capsys):
    rc = main(
        [
            "train",
            "--model",
            str(tiny_dir),
            "--dataset",
            str(pairs_file),
            "--lora",
            "--lora-target-modules",
            "q_proj,c_attn",
            "--report-to",
            "none",
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert rc == 2 and "c_attn" in _err(capsys)


def test_deepspeed_missing_is_a_clear_error(monkeypatch, tmp_path):
    from prefzoo.train.engines import EngineSettings, build_accelerator
    from prefzoo.train.engines.deepspeed import DeepSpeedMissingError

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import deepspeed -> ImportError
    cfg = TrainConfig(model="x", dataset="y", deepspeed="zero2", output_dir=str(tmp_path))
    with pytest.raises(DeepSpeedMissingError, match=r'pip install -e "\.\[deepspeed\]" from the prefzoo clone'):
        build_accelerator(EngineSettings.of(cfg), None, str(tmp_path))
