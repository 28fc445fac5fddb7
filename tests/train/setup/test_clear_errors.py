"""Bad --model inputs are one-line errors raised before anything loads (issue 16, "Clear errors")."""

from __future__ import annotations

import shutil

import pytest

from prefzoo.cli.main import main


def _err(capsys) -> str:
    return capsys.readouterr().err


def test_a_missing_local_model_folder_is_named(capsys, tmp_path, pairs_file):
    rc = main(["train", "--model", "./nomodel", "--dataset", str(pairs_file), "--output-dir", str(tmp_path)])
    err = _err(capsys)
    assert rc == 2 and err.count("\n") == 1
    assert "--model ./nomodel: no such folder" in err and "Repo id" not in err


def test_a_model_folder_without_a_tokenizer_fails_before_the_model_loads(capsys, tmp_path, tiny_dir, pairs_file):
    bare = tmp_path / "bare"
    shutil.copytree(tiny_dir, bare)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (bare / f).unlink(missing_ok=True)
    (bare / "model.safetensors").write_bytes(b"not weights")  # loading the model would fail differently
    rc = main(["train", "--model", str(bare), "--dataset", str(pairs_file), "--output-dir", str(tmp_path / "o")])
    err = _err(capsys)
    assert rc == 2 and err.count("\n") == 1
    assert "has no tokenizer" in err and "tokenizer.save_pretrained" in err


@pytest.mark.parametrize("name", ["org/model", "gpt2"])
def test_hub_names_are_not_taken_for_folders(name):
    from prefzoo.model.loading import check_model_source

    check_model_source(name)
