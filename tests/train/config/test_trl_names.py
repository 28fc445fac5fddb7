"""TRL's option names and bad flag values (issue 16, "Clear errors"): one alias table for flags, YAML and docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prefzoo.cli.main import build_parser, main
from prefzoo.cli.train import _collect
from prefzoo.train.config import ConfigError, TrainConfig
from prefzoo.train.config.aliases import TRL_OPTIONS, trl_table_markdown

ALIASES = {name: opt.key for name, opt in TRL_OPTIONS.items() if opt.key is not None}
REDIRECTS = {name: opt.instead for name, opt in TRL_OPTIONS.items() if opt.key is None}
_VALUE = {"model": "m", "dataset": "d.jsonl", "report_to": "none", "output_dir": "out", "lora_target_modules": "q_proj",
          "warmup_ratio": "0.2", "weight_decay": "0.1", "lora_dropout": "0.2", "max_grad_norm": "0.5",
          "lr": "0.01", "attn_implementation": "eager", "torch_dtype": "bfloat16", "lr_scheduler_type": "linear",
          "push_to_hub": "org/name"}  # fmt: skip  # flag values that differ from the defaults; others "3"
_NEEDS = {"load_in_4bit": {"lora": True}, "load_in_8bit": {"lora": True}}  # other keys a valid value needs


def _config(argv: list[str]) -> TrainConfig:
    values, _ = _collect(build_parser().parse_args(["train", *argv]))
    return TrainConfig.from_dict(values)


def _one_line_error(capsys, argv: list[str]) -> str:
    rc = main(["train", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    return err


def test_a_bad_flag_value_is_one_line_naming_the_flag_and_what_is_expected(capsys):
    err = _one_line_error(capsys, ["--lr", "abc", "--model", "m", "--dataset", "d.jsonl"])
    assert err == "prefzoo train: error: --lr 'abc': expected a number\n"
    err = _one_line_error(capsys, ["--seed", "abc"])  # the default task reads the seed first
    assert err == "prefzoo train: error: --seed 'abc': expected an integer\n"


def test_a_bad_yaml_value_names_the_file_and_key(capsys, tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("learning_rate: abc\nmodel: m\ndataset: d.jsonl\n")
    err = _one_line_error(capsys, ["--config", str(run)])
    assert err == f"prefzoo train: error: --config {run}: lr 'abc': expected a number\n"


@pytest.mark.parametrize("name", sorted(ALIASES))
@pytest.mark.parametrize("dashes", [False, True])
def test_trl_flags_are_aliases(name, dashes):
    key = ALIASES[name]
    flag = "--" + (name.replace("_", "-") if dashes else name)
    value = "3" if key not in _VALUE else _VALUE[key]
    kind = type(getattr(TrainConfig(), key))
    extra = ["--lora"] if key in _NEEDS else []
    cfg = _config([*extra, flag] if kind is bool else [flag, value])
    expected = True if kind is bool else TrainConfig.from_dict({key: value}).to_dict()[key]
    assert cfg.to_dict()[key] == expected != TrainConfig().to_dict()[key]


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_trl_yaml_keys_are_aliases(name, tmp_path):
    key = ALIASES[name]
    value = "3" if key not in _VALUE else _VALUE[key]
    kind = type(getattr(TrainConfig(), key))
    run = tmp_path / "run.yaml"
    run.write_text(f"{name}: {'true' if kind is bool else value}\n" + ("lora: true\n" if key in _NEEDS else ""))
    cfg = _config(["--config", str(run)])
    need = _NEEDS.get(key, {})
    assert cfg.to_dict()[key] == TrainConfig.from_dict({key: True if kind is bool else value, **need}).to_dict()[key]


@pytest.mark.parametrize("name", sorted(REDIRECTS))
def test_trl_flags_with_another_meaning_point_to_prefzoo_s_option(capsys, name):
    err = _one_line_error(capsys, [f"--{name}", "0.1", "--model", "m", "--dataset", "d.jsonl"])
    assert err == f"prefzoo train: error: --{name} is TRL's option; in prefzoo: {REDIRECTS[name]}\n"


@pytest.mark.parametrize("name", sorted(REDIRECTS))
def test_trl_yaml_keys_with_another_meaning_point_to_prefzoo_s_option(name):
    message = f"run.yaml: {name} is TRL's option; in prefzoo: {REDIRECTS[name]}"
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig.from_dict({name: 0.1}, where="run.yaml")


def test_the_redirects_name_the_right_prefzoo_option():
    assert REDIRECTS["beta"].startswith("--loss-param beta=")
    assert REDIRECTS["loss_type"].startswith("--loss ")
    assert "--keep-dropout" in REDIRECTS["disable_dropout"]
    assert "--max-prompt-length" in REDIRECTS["max_length"]


def test_a_key_under_both_names_is_an_error_and_a_flag_overrides_a_yaml_alias(tmp_path):
    with pytest.raises(ConfigError, match="lr is given twice"):
        TrainConfig.from_dict({"lr": 0.1, "learning_rate": 0.2})
    run = tmp_path / "run.yaml"
    run.write_text("learning_rate: 0.2\n")
    assert _config(["--config", str(run), "--lr", "0.1"]).lr == 0.1


def test_every_alias_names_a_config_key():
    assert set(ALIASES.values()) <= set(TrainConfig.keys())
    assert not set(REDIRECTS) & set(TrainConfig.keys())


def test_the_coming_from_trl_table_in_the_docs_is_the_alias_table():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "training.md").read_text()
    begin = "<!-- trl-table: generated from prefzoo.train.config.aliases.TRL_OPTIONS -->"
    found = re.search(re.escape(begin) + r"\n(.*?)<!-- /trl-table -->", doc, re.S)
    assert found, "docs/training.md lost its 'Coming from TRL' table markers"
    assert found.group(1) == trl_table_markdown(), (
        "docs/training.md's TRL table is stale: replace the block with "
        "prefzoo.train.config.aliases.trl_table_markdown()"
    )
