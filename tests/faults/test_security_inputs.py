"""Files and settings a user hands us, run as a user runs them (the CLI in a subprocess): remote code is named, secrets
stay out of what a run writes, the hub repo's visibility is chosen and said, a checkpoint resumes on another number
of processes without arithmetic, and bad inputs are one line naming the input and the fix, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prefzoo import registry
from tests.faults._run import ROOT, env
from tests.support.hub_stub import HubStub

SECRET = "sk-not-for-cards-0123456789"


def cli(*args: str, cwd: Path | None = None, launcher: list[str] | None = None, **extra: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``prefzoo ARGS`` in a fresh process; ``extra``: environment variables."""
    e = {**env(), **extra}
    e.pop(registry.DISABLE_AUTOLOAD_ENV, None)
    cmd = [*(launcher or [sys.executable]), "-m", "prefzoo.cli.main", *args]
    proc = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=600, cwd=cwd or ROOT)
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_line_error(rc: int, err: str, *fragments: str) -> None:
    """Exit status 2 and one line on stderr holding each of ``fragments`` (no traceback)."""
    lines = [x for x in err.splitlines() if x.strip() and "[WARNING]" not in x]  # DeepSpeed's import notice aside
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def train_args(model: Path | str, data: Path | str, out: Path, *more: str) -> list[str]:
    return ["train", "--model", str(model), "--dataset", str(data), "--output-dir", str(out), "--loss", "simpo",
            "--report-to", "none", "--no-progress", "--eval-fraction", "0", "--per-device-batch-size", "2",
            "--grad-accum", "1", *more]  # fmt: skip


# -- item 5: remote code, secrets, the hub repo's visibility ------------------------------------------------------
@pytest.fixture(scope="module")
def pushed_run(tmp_path_factory, tiny_dir, pairs_file):
    """One run with --trust-remote-code on a folder holding Python files, a secret in judge_params and a callback's
    options (from YAML), and --push-to-hub --hub-private-repo to a local stand-in for the hub."""
    root = tmp_path_factory.mktemp("pushed")
    model = root / "model-with-code"
    shutil.copytree(tiny_dir, model)
    (model / "modeling_custom.py").write_text("RAN = True\n")
    (model / "tokenization_custom.py").write_text("RAN = True\n")
    (root / "tokencb.py").write_text(  # a callback that takes a service token, as a tracker's would
        "from prefzoo.train import Callback\n\n\nclass Upload(Callback):\n"
        "    def __init__(self, token, every=1):\n        self.token, self.every = token, every\n"
    )
    config = root / "run.yaml"
    config.write_text(
        f"judge_params: [api_key={SECRET}, tie_tolerance=0.1]\n"
        f"callbacks: ['tokencb:Upload:every=2,token={SECRET}']\n"
    )
    out = root / "out"
    with HubStub() as hub:
        args = train_args(model, pairs_file, out, "--config", str(config), "--max-steps", "1", "--trust-remote-code",
                          "--push-to-hub", "me/private-run", "--hub-private-repo")  # fmt: skip
        rc, stdout, stderr = cli(*args, HF_HUB_OFFLINE="0", HF_ENDPOINT=hub.url, HF_TOKEN="hf_test_token",
                                 PYTHONPATH=f"{ROOT}{os.pathsep}{root}")  # fmt: skip
    assert rc == 0, (stdout[-3000:], stderr[-3000:])
    return {"out": out, "stdout": stdout, "stderr": stderr, "hub": hub, "model": model}


def test_trust_remote_code_says_which_python_files_will_run(pushed_run):
    lines = [x for x in pushed_run["stdout"].splitlines() if "--trust-remote-code" in x]
    assert len(lines) == 1, pushed_run["stdout"][-3000:]
    assert f"Python code from {pushed_run['model']} will run" in lines[0]
    assert "modeling_custom.py, tokenization_custom.py" in lines[0]


def test_secrets_reach_no_card_no_log_and_no_upload(pushed_run):
    out, hub = pushed_run["out"], pushed_run["hub"]
    card = json.loads((out / "final" / "run_card.json").read_text())
    assert card["config"]["judge_params"] == ["api_key=<redacted>", "tie_tolerance=0.1"]
    assert card["config"]["callbacks"] == ["tokencb:Upload:every=2,token=<redacted>"]
    written = [p for p in out.rglob("*") if p.is_file()]
    assert written and not [p for p in written if SECRET.encode() in p.read_bytes()]
    uploaded = hub.repos["me/private-run"]
    assert "run_card.json" in uploaded and not [n for n, data in uploaded.items() if SECRET.encode() in data]
    assert SECRET not in pushed_run["stdout"] + pushed_run["stderr"]


def test_hub_private_repo_creates_a_private_repo_and_says_so(pushed_run):
    assert pushed_run["hub"].private == {"me/private-run": True}
    pushed = [x for x in pushed_run["stdout"].splitlines() if x.startswith("prefzoo train: pushed ")]
    assert len(pushed) == 1 and pushed[0].endswith("me/private-run is a private repository"), pushed


def test_push_to_hub_says_when_the_repo_is_public(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    from prefzoo.train.checkpoint.hub import push_folder, visibility_line

    (tmp_path / "README.md").write_text("a model\n")
    with HubStub() as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        _, private = push_folder(tmp_path, "me/public-run", "m")
        assert private is False and hub.private == {"me/public-run": False}
        _, again = push_folder(tmp_path, "me/public-run", "m", private=True)  # an existing repo keeps its visibility
    assert again is False
    assert "PUBLIC repository" in visibility_line("me/public-run", private, False)
    assert "--hub-private-repo creates a private one" in visibility_line("me/public-run", private, False)
    assert "kept its visibility" in visibility_line("me/public-run", again, True)


# -- item 8: resuming on another number of processes --------------------------------------------------------------
@pytest.fixture(scope="module")
def two_process_checkpoint(tmp_path_factory, tiny_dir, pairs_file):
    """A run of 2 processes × 2 pairs × 1 accumulation = 4 examples per step, stopped after its first step."""
    out = tmp_path_factory.mktemp("two") / "out"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone"]
    args = train_args(tiny_dir, pairs_file, out, "--max-steps", "2", "--save-steps", "1", "--stop-after-steps", "1")
    rc, stdout, stderr = cli(*args, launcher=torchrun)
    assert (out / "checkpoints" / "step-00000001").is_dir(), (rc, stdout[-2000:], stderr[-3000:])
    return out


@pytest.mark.slow
def test_resume_on_one_process_is_refused_with_the_numbers_and_the_flags(two_process_checkpoint, tiny_dir, pairs_file,
                                                                          tmp_path):  # fmt: skip
    out = tmp_path / "out"
    shutil.copytree(two_process_checkpoint, out)
    rc, _, err = cli(*train_args(tiny_dir, pairs_file, out, "--max-steps", "2", "--resume", "auto"))
    numbers = "trained 4 examples per step (2 processes × 2 per device × 1 accumulation), this run 2 (1 × 2 × 1)"
    assert_one_line_error(rc, err, numbers, "set --per-device-batch-size 2 --grad-accum 2")


@pytest.mark.slow
def test_resume_on_one_process_without_batch_flags_keeps_the_examples_per_step(two_process_checkpoint, tiny_dir,
                                                                                pairs_file, tmp_path):  # fmt: skip
    out = tmp_path / "out"
    shutil.copytree(two_process_checkpoint, out)
    base = ["train", "--model", str(tiny_dir), "--dataset", str(pairs_file), "--output-dir", str(out), "--loss",
            "simpo", "--report-to", "none", "--no-progress", "--eval-fraction", "0"]  # fmt: skip
    rc, stdout, stderr = cli(*base, "--max-steps", "2", "--resume", "auto")  # neither batch flag: the user's choice
    assert rc == 0, (stdout[-3000:], stderr[-3000:])
    said = [x for x in stdout.splitlines() if "resuming a checkpoint of 2 processes" in x]
    assert len(said) == 1 and "--per-device-batch-size 2 --grad-accum 2 keep them" in said[0], stdout[-3000:]
    assert "1 process(es) × 2 pairs × 2 accumulation = 4 pairs per step" in stdout
    assert json.loads((out / "final" / "run_card.json").read_text())["steps"] == 2


# -- item 9: tracebacks left ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (b"lr: [1, 2\nloss: dpo\n", ("not valid YAML at line 2, column 5", "fix the file there")),
        (b"lr: 1e-3\n# caf\xe9\n", ("not UTF-8 text (byte 0xe9 at offset 14)", "save the file as UTF-8")),
    ],
    ids=["does-not-parse", "not-utf8"],
)
def test_a_bad_yaml_file_is_one_line(tmp_path, text, fragments):
    path = tmp_path / "run.yaml"
    path.write_bytes(text)
    rc, _, err = cli("train", "--config", str(path))
    assert_one_line_error(rc, err, f"--config {path}", *fragments)


def test_hub_names_while_offline_are_one_line(tmp_path, tiny_dir, pairs_file):
    rc, _, err = cli(*train_args(tiny_dir, "org/no-such-data", tmp_path / "a"))
    assert_one_line_error(rc, err, "--dataset org/no-such-data: a hub dataset name, and the hub is offline",
                          "hf download org/no-such-data --repo-type dataset")  # fmt: skip
    rc, _, err = cli(*train_args("org/no-such-model", pairs_file, tmp_path / "b"))
    assert_one_line_error(rc, err, "--model org/no-such-model: a hub model name, and the hub is offline",
                          "hf download org/no-such-model")  # fmt: skip


def test_token_ids_beyond_the_vocabulary_are_one_line(tmp_path, pairs_file):
    from prefzoo.data.tiny import char_tokenizer
    from tests.support.tiny import build_model, build_tokenizer

    model = tmp_path / "small-vocab"  # the model knows letters only; its saved tokenizer also has digits
    build_model(char_tokenizer("abcdefghijklmnopqrstuvwxyz", bos=False, model_max_length=None)).save_pretrained(model)
    build_tokenizer().save_pretrained(model)
    rc, _, err = cli(*train_args(model, pairs_file, tmp_path / "out", "--max-steps", "1"))
    assert_one_line_error(rc, err, f"--model {model}: the tokenizer gives token id", "embedding has 30 rows",
                          "resize_token_embeddings")  # fmt: skip


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_eval_on_a_broken_safetensors_file_is_one_line(tmp_path, tiny_dir, pairs_file, damage):
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else os.urandom(4096))
    rc, _, err = cli("eval", "--model", str(model), "--reward-accuracy", "--dataset", str(pairs_file), "--loss",
                     "simpo")  # fmt: skip
    assert_one_line_error(rc, err, f"--model {model}: model.safetensors is not a complete safetensors file",
                          "truncated or corrupt")  # fmt: skip


def test_a_stray_local_rank_without_a_launcher_is_one_line(tmp_path, tiny_dir, pairs_file):
    rc, _, err = cli(*train_args(tiny_dir, pairs_file, tmp_path / "out", "--max-steps", "1"), LOCAL_RANK="1")
    assert_one_line_error(rc, err, "LOCAL_RANK=1 is set, but no launcher started this process",
                          "env -u LOCAL_RANK")  # fmt: skip


@pytest.fixture
def exiting_plugin(tmp_path) -> dict[str, Any]:
    """An installed distribution whose ``prefzoo`` entry point calls ``sys.exit(3)`` when imported."""
    site = tmp_path / "site"
    (site / "exiting_plugin").mkdir(parents=True)
    (site / "exiting_plugin" / "__init__.py").write_text("import sys\n\nsys.exit(3)\n")
    info = site / "exiting_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: exiting-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[prefzoo]\nexiter = exiting_plugin\n")
    return {"PYTHONPATH": f"{ROOT}{os.pathsep}{site}"}


def test_a_plugin_calling_sys_exit_at_import_is_named_and_skipped(exiting_plugin):
    rc, out, err = cli("losses", **exiting_plugin)
    assert rc == 0, (out[-2000:], err[-2000:])
    assert "mmpo" in out and "dpo" in out
    assert "plugin 'exiter' failed to load: SystemExit: sys.exit(3) at import" in out + err
