"""Off the happy path, run as a user runs it (``prefzoo`` in a subprocess): every bad input below is one line on
stderr and exit status 2, with no traceback, and each is caught before the model loads."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tiny import write_jsonl

CONVERSATIONS = [
    {
        "prompt": [{"role": "user", "content": f"add {a}+{a}"}],
        "chosen": [{"role": "assistant", "content": f"{2 * a}"}],
        "rejected": [{"role": "assistant", "content": f"{2 * a + 1}"}],
    }
    for a in range(10, 18)
]


def _prefzoo(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "prefzoo", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The single error line of a failed command (stderr may carry library warnings before it)."""
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def _train(tmp_path: Path, model: Path | str, dataset: Path | str, *more: str) -> subprocess.CompletedProcess[str]:
    return _prefzoo("train", "--model", str(model), "--dataset", str(dataset), "--output-dir",
                    str(tmp_path / "out"), "--max-steps", "1", "--no-progress", *more, cwd=tmp_path)  # fmt: skip


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda d: d / "afile", "--output-dir {p} is a file, not a folder"),
        (lambda d: d / "afile" / "run", "--output-dir {p} lies under {d}/afile, which is a file"),
        (lambda d: Path("/sys/prefzoo-test-run"), "--output-dir {p} cannot be written (operation not permitted)"),
    ],
    ids=["a-file", "under-a-file", "not-writable"],
)
def test_an_output_dir_that_cannot_hold_the_run(tmp_path, tiny_dir, pairs_file, make, expected):
    (tmp_path / "afile").write_text("not a folder")
    out = make(tmp_path)
    proc = _prefzoo("train", "--model", str(tiny_dir), "--dataset", str(pairs_file), "--output-dir", str(out),
                    cwd=tmp_path)  # fmt: skip
    line = _one_line_error(proc)
    assert expected.format(p=out, d=tmp_path) in line and "give --output-dir a folder you can write to" in line


def test_a_read_only_filesystem_is_named(tmp_path, monkeypatch):
    from prefzoo.train.setup.preflight import OutputDirError, check_output_dir

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(OutputDirError, match="cannot be written \\(the filesystem is read-only\\)"):
        check_output_dir(tmp_path / "run")


def test_a_model_folder_without_weights_fails_before_loading(tmp_path, tiny_dir, pairs_file):
    bare = tmp_path / "no-weights"
    shutil.copytree(tiny_dir, bare)
    (bare / "model.safetensors").unlink()
    line = _one_line_error(_train(tmp_path, bare, pairs_file))
    assert f"--model {bare}: the folder has no weights (model.safetensors" in line
    assert "model.save_pretrained(folder)" in line


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{% for m in messages %}{{ m['content'] }}\n{% endfor %\n", "line 2: TemplateSyntaxError:"),
        ("{{ bos_token }}\n{{ raise_exception('this template takes no user role') }}",
         "line 2: TemplateError: this template takes no user role"),
    ],
    ids=["syntax", "raise"],
)  # fmt: skip
def test_a_broken_chat_template_file_is_one_line_before_the_model_loads(tmp_path, tiny_dir, template, expected):
    data = write_jsonl(tmp_path / "conv.jsonl", CONVERSATIONS)
    (tmp_path / "bad.jinja").write_text(template)
    proc = _train(tmp_path, tiny_dir, data, "--chat-template", str(tmp_path / "bad.jinja"))
    line = _one_line_error(proc)
    assert f"chat template ({tmp_path / 'bad.jinja'} (--chat-template)), {expected}" in line, line
    assert "--chat-template PATH.jinja" in line
    assert "log-prob self-check" not in proc.stdout  # nothing past the template check ran


def test_the_tokenizers_own_broken_template_is_named(tmp_path, tiny_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% if messages %}{{ messages[0]['content'] }"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    data = write_jsonl(tmp_path / "conv.jsonl", CONVERSATIONS)
    line = _one_line_error(_train(tmp_path, model, data))
    assert "chat template (the tokenizer's own), line 1: TemplateSyntaxError:" in line, line


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--merge-lora"], "--merge-lora has no effect without --lora"),
        (["--loss", "simpo", "--precompute-ref"], "--precompute-ref has no effect with loss 'simpo'"),
    ],
)
def test_an_option_that_would_be_ignored_is_refused(tmp_path, tiny_dir, pairs_file, flags, expected):
    line = _one_line_error(_train(tmp_path, tiny_dir, pairs_file, *flags))
    assert expected in line
    assert not (tmp_path / "out").exists()  # refused before the run touched its output folder


def test_a_yaml_key_typo_names_the_key_it_means_and_not_every_key(tmp_path, tiny_dir, pairs_file):
    (tmp_path / "run.yaml").write_text("learnig_rate: 1.0e-5\nepoks: 2\n")
    line = _one_line_error(_train(tmp_path, tiny_dir, pairs_file, "--config", str(tmp_path / "run.yaml")))
    assert "unknown keys 'epoks' (did you mean 'epochs'?), 'learnig_rate' (did you mean 'learning_rate'?)" in line
    assert "prefzoo train --help" in line and "per_device_batch_size" not in line


def test_an_empty_dataset_file_says_so(tmp_path, tiny_dir):
    (tmp_path / "empty.jsonl").write_text("")
    line = _one_line_error(_train(tmp_path, tiny_dir, tmp_path / "empty.jsonl"))
    assert f"--dataset {tmp_path / 'empty.jsonl'}: the file is empty" in line


def test_pairs_whose_chosen_equals_rejected_are_named_first(tmp_path, tiny_dir):
    data = write_jsonl(tmp_path / "same.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "b"}] * 4)
    line = _one_line_error(_train(tmp_path, tiny_dir, data))
    assert "all 4 pairs were dropped: 4 with chosen identical to rejected;" in line


def test_eval_on_a_lora_adapter_takes_its_base_model_as_the_baseline(tmp_path, tiny_dir, pairs_file):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    adapter = tmp_path / "adapter"
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], task_type="CAUSAL_LM")
    get_peft_model(base, lora).save_pretrained(adapter)
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_dir)
    proc = _prefzoo("eval", "--model", str(adapter), "--reward-accuracy", "--dataset", str(pairs_file), "--loss",
                    "dpo", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"baseline: {tiny_dir}, the base model of the LoRA adapter --model {adapter}" in proc.stdout
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    proc = _prefzoo("eval", "--model", str(adapter), "--reward-accuracy", "--dataset", str(pairs_file), "--loss",
                    "dpo", cwd=tmp_path)  # fmt: skip
    assert f"is a LoRA adapter of {tmp_path / 'gone'} (adapter_config.json), which is not on this machine" in (
        _one_line_error(proc)
    )
