"""The trainer's callback API: hook order and state, errors named, should_stop, loading by --callback / entry point."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from prefzoo.train import Callback
from prefzoo.train.callbacks import ENTRY_POINT_GROUP, CallbackError, builtin_callbacks, load_callback
from prefzoo.train.checkpoint.save import find_latest_checkpoint, read_marker
from prefzoo.train.config import ConfigError
from tests.train.helpers import base_config, max_param_diff, params_of, run_inprocess

# 64 pairs, 16 held out: 48 train pairs = 6 micro-batches of 8 = 3 optimizer steps (accumulation 2) per epoch
EPOCHS = dict(per_device_batch_size=8, grad_accum=2, max_steps=None, epochs=2, eval_fraction=0.25, logging_steps=2)


class Recorder(Callback):
    """Records every hook with the state it saw."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.seen: dict[str, list[object]] = {}

    def _rec(self, hook: str, state, arg=None) -> None:
        self.calls.append((hook, state.global_step, state.epoch))
        self.seen.setdefault(hook, []).append(arg)
        assert state.total_steps == 6 and state.steps_per_epoch == 3
        assert state.accelerator.process_index == 0 and state.tokenizer is not None and state.model is not None

    def on_train_begin(self, state):
        self._rec("on_train_begin", state)

    def on_step_begin(self, state):
        self._rec("on_step_begin", state, state.batch["ids"])

    def on_batch(self, state, fields):
        self._rec("on_batch", state, sorted(fields))

    def on_before_optimizer_step(self, state, params):
        self._rec("on_before_optimizer_step", state, all(p.grad is not None for p in params))

    def on_step_end(self, state):
        self._rec("on_step_end", state, state.loss)

    def on_log(self, state, metrics):
        self._rec("on_log", state, metrics["step"])

    def on_evaluate(self, state, metrics):
        self._rec("on_evaluate", state, metrics["eval/pairs"])

    def on_save_files(self, state, path):
        self._rec("on_save_files", state, path.name)

    def on_save(self, state, path):
        self._rec("on_save", state, read_marker(path)["step"])

    def on_epoch_end(self, state, model):
        self._rec("on_epoch_end", state, type(model).__name__)

    def on_train_end(self, state):
        self._rec("on_train_end", state)


def _step(step: int, epoch: int, log: bool, save: bool) -> list[tuple[str, int, int]]:
    calls = [("on_step_begin", step - 1, epoch), ("on_batch", step - 1, epoch), ("on_batch", step - 1, epoch)]
    calls += [("on_before_optimizer_step", step - 1, epoch), ("on_step_end", step, epoch)]
    calls += [("on_log", step, epoch)] if log else []
    calls += [("on_save_files", step, epoch), ("on_save", step, epoch)] if save else []
    return calls


def test_every_hook_is_called_in_order_with_the_run_state(tmp_path, tiny_dir, pairs_file):
    rec = Recorder()
    cfg = base_config(tiny_dir, pairs_file, tmp_path / "run", eval_at_start=True, **EPOCHS)
    res = run_inprocess(cfg, callbacks=[rec])
    expected = [("on_train_begin", 0, 0), ("on_evaluate", 0, 0)]
    for epoch in (1, 2):
        for step in range(3 * epoch - 2, 3 * epoch + 1):
            expected += _step(step, epoch, log=step % 2 == 0 or step == 6, save=step % 3 == 0)
        expected += [("on_evaluate", 3 * epoch, epoch), ("on_epoch_end", 3 * epoch, epoch)]
    expected += [("on_train_end", 6, 2)]
    assert rec.calls == expected
    assert res.global_step == 6 and res.final_dir is not None
    seen = rec.seen
    assert all(len(ids) == 8 for ids in seen["on_step_begin"])  # the step's first micro-batch
    assert all("policy_chosen_logps" in f and "ref_chosen_logps" in f for f in seen["on_batch"])
    assert all(seen["on_before_optimizer_step"])  # gradients are there
    assert all(math.isfinite(x) for x in seen["on_step_end"])  # state.loss
    assert seen["on_log"] == [2, 4, 6] and seen["on_save"] == [3, 6]
    assert seen["on_save_files"] == [".tmp-step-00000003", ".tmp-step-00000006"]
    assert seen["on_evaluate"] == [16.0, 16.0, 16.0] and seen["on_epoch_end"] == ["LlamaForCausalLM"] * 2


def _flags(cfg: dict) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in cfg.items() if v is not None and not isinstance(v, bool)]


class Boom(Callback):
    def on_step_end(self, state):
        if state.global_step == 2:
            raise ZeroDivisionError("deliberate\nsecond line")


def test_a_raising_callback_is_reported_by_name_in_one_line(tmp_path, tiny_dir, pairs_file):
    with pytest.raises(CallbackError) as e:
        run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "run"), callbacks=[Boom()])
    msg = str(e.value)
    assert "callback 'Boom'" in msg and "on_step_end at step 2" in msg and "ZeroDivisionError: deliberate" in msg
    assert "\n" not in msg


def test_a_raising_callback_is_one_cli_error_line(tmp_path, tiny_dir, pairs_file, capsys):
    from prefzoo.cli.main import main

    cfg = base_config(tiny_dir, pairs_file, tmp_path / "run")
    args = ["train", *_flags(cfg)]
    assert main([*args, "--no-progress", "--callback", "tests.train.callbacks.test_callbacks:Boom"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("prefzoo train: error")]
    assert len(err) == 1 and "callback 'Boom'" in err[0], err


class StopAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, state):
        if state.global_step == self.step:
            state.should_stop, state.stop_reason = True, f"asked to stop at {self.step}"


def test_should_stop_stops_at_the_step_boundary_with_a_resumable_checkpoint(tmp_path, tiny_dir, pairs_file):
    kw = dict(max_steps=6, grad_accum=2, save_steps=4)
    full = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "full", **kw))
    out = tmp_path / "stopped"
    first = run_inprocess(base_config(tiny_dir, pairs_file, out, **kw), callbacks=[StopAt(3)])
    assert first.stopped_early and first.stop_reason == "asked to stop at 3" and first.global_step == 3
    assert find_latest_checkpoint(out).name == "step-00000003" and first.final_dir is not None
    second = run_inprocess(base_config(tiny_dir, pairs_file, out, resume="auto", **kw))
    assert second.global_step == 6 and not second.stopped_early
    assert max_param_diff(params_of(full.model), params_of(second.model)) < 1e-6
    assert max_param_diff(params_of(first.model), params_of(second.model)) > 1e-4  # the comparison can fail


def test_early_stopping_stops_when_the_metric_does_not_improve(tmp_path, tiny_dir, pairs_file):
    # eval/pairs is the same at every evaluation: the first epoch's evaluation does not beat the one before training
    kw = {**EPOCHS, "epochs": 3, "eval_at_start": True}
    cb = "early-stopping:metric=eval/pairs,patience=1"
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "run", callbacks=[cb], **kw))
    assert res.stopped_early and res.global_step == 3 and len(res.evals) == 2
    assert res.stop_reason.startswith("early stopping: eval/pairs did not improve on 16 (step 0)")
    assert find_latest_checkpoint(tmp_path / "run").name == "step-00000003" and res.final_dir is not None


def test_early_stopping_patience_and_mode():
    from types import SimpleNamespace

    from prefzoo.train.callbacks.early_stopping import EarlyStopping

    es = EarlyStopping(metric="eval/loss", patience=2, min_delta=0.01)
    state = SimpleNamespace(global_step=0, should_stop=False, stop_reason=None)
    for step, loss in enumerate([1.0, 0.9, 0.895, 0.95], start=1):
        state.global_step = step
        es.on_evaluate(state, {"eval/loss": loss})
        assert state.should_stop == (step == 4), step  # 0.895 is not better by more than min_delta
    assert es.best == 0.9 and es.best_step == 2
    assert EarlyStopping("eval/reward_accuracy").mode == "max"
    with pytest.raises(ValueError, match="patience=0"):
        EarlyStopping(patience=0)
    with pytest.raises(KeyError, match="eval/nope"):
        EarlyStopping("eval/nope").on_evaluate(state, {"eval/loss": 1.0})


def test_win_rate_callback_judges_every_epoch(tmp_path, tiny_dir, pairs_file):
    from prefzoo.eval.callbacks import WinRateCallback

    prompts = ["1+2=", "10+5=", "7+7="]
    wr = WinRateCallback(prompts, judge="oracle", max_new_tokens=3)
    kw = {**EPOCHS, "epochs": 2}
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path / "run", **kw), callbacks=[wr])
    assert [h["epoch"] for h in wr.history] == [1, 2] and [h["step"] for h in wr.history] == [3, 6]
    assert all(h["winrate/n"] == 3 and 0 <= h["winrate/win_rate"] <= 1 for h in wr.history)
    logged = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["winrate/win_rate"] for r in logged if "winrate/win_rate" in r] == [
        h["winrate/win_rate"] for h in wr.history
    ]
    assert res.global_step == 6
    from transformers import AutoModelForCausalLM

    # the baseline is the starting model: a frozen copy, untouched by training

    assert max_param_diff(params_of(wr.baseline), params_of(AutoModelForCausalLM.from_pretrained(tiny_dir))) == 0.0
    with pytest.raises(Exception, match="unknown judge"):
        WinRateCallback(prompts, judge="no-such-judge")


@pytest.fixture
def installed_callback(tmp_path, monkeypatch):
    """A real distribution on sys.path (package + dist-info with a prefzoo.callbacks entry point)."""
    site = tmp_path / "site"
    (site / "stepcounter").mkdir(parents=True)
    (site / "stepcounter" / "__init__.py").write_text(
        textwrap.dedent(
            """
            from pathlib import Path

            from prefzoo.train import Callback


            class StepCounter(Callback):
                def __init__(self, out, every=1):
                    self.out, self.every, self.steps = Path(out), int(every), []

                def on_step_end(self, state):
                    if state.global_step % self.every == 0:
                        self.steps.append(state.global_step)

                def on_train_end(self, state):
                    self.out.write_text(",".join(map(str, self.steps)))
            """
        )
    )
    info = site / "stepcounter-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: stepcounter\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[prefzoo.callbacks]\nstep-counter = stepcounter:StepCounter\n")
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("stepcounter", None)


def test_entry_point_and_module_path_load_an_installed_callback(installed_callback, tmp_path):
    by_name = load_callback(f"step-counter:out={tmp_path / 'a.txt'},every=2")
    assert type(by_name).__name__ == "StepCounter" and by_name.every == 2
    by_path = load_callback({"callback": "stepcounter:StepCounter", "out": str(tmp_path / "b.txt")})
    assert type(by_path) is type(by_name) and by_path.every == 1
    with pytest.raises(ConfigError, match=r"--callback 'no-such-callback'.*known: .*step-counter"):
        load_callback("no-such-callback")
    with pytest.raises(ConfigError, match=r"--callback 'stepcounter:Missing'.*AttributeError"):
        load_callback("stepcounter:Missing")


def test_cli_and_yaml_callbacks_run_in_training(installed_callback, tmp_path, tiny_dir, pairs_file, capsys):
    from prefzoo.cli.main import main

    cfg = base_config(tiny_dir, pairs_file, tmp_path / "run", max_steps=4)
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text(f"callbacks:\n  - callback: stepcounter:StepCounter\n    out: {tmp_path / 'yaml.txt'}\n")
    args = ["train", "--config", str(yaml_file), "--no-progress"]
    args += _flags(cfg)
    args += ["--callback", f"step-counter:out={tmp_path / 'flag.txt'},every=2"]
    assert main(args) == 0, capsys.readouterr().err
    assert (tmp_path / "yaml.txt").read_text() == "1,2,3,4"  # the YAML file's callback
    assert (tmp_path / "flag.txt").read_text() == "2,4"  # and the flag's, added to it
    card = json.loads((tmp_path / "run" / "final" / "run_card.json").read_text())
    assert len(card["config"]["callbacks"]) == 2


def test_the_built_in_callbacks_are_entry_points_declared_where_they_live():
    """prefzoo's own callbacks are entry points of group ``prefzoo.callbacks`` in its pyproject.toml, as a plugin
    declares its own (the trainer names none of them); the installed metadata holds them and each name loads."""
    tomllib = pytest.importorskip("tomllib")
    from prefzoo.eval.callbacks import WinRateCallback
    from prefzoo.train.callbacks import EarlyStopping
    from prefzoo.train.callbacks.ref_sync import ReferenceSync

    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]
    eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    installed = {ep.name: ep.value for ep in eps if ep.dist is not None and ep.dist.name == "prefzoo"}
    assert installed == declared, "prefzoo's installed metadata is stale: reinstall it (pip install -e .)"
    assert builtin_callbacks() == ["early-stopping", "reference-sync", "win-rate"]
    assert type(load_callback("early-stopping:patience=2")) is EarlyStopping
    assert type(load_callback("reference-sync:sync_steps=4")) is ReferenceSync
    assert type(load_callback({"callback": "win-rate", "prompts": ["1+2="]})) is WinRateCallback


def _cli_train(tmp_path, *callbacks: str) -> subprocess.CompletedProcess:
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "1+2=", "chosen": "3", "rejected": "4"}) + "\n")
    args = [sys.executable, "-m", "prefzoo", "train", "--model", str(tmp_path / "no-model"), "--dataset", str(data),
            "--output-dir", str(tmp_path / "run")]  # fmt: skip
    for cb in callbacks:
        args += ["--callback", cb]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def test_callback_names_from_the_cli(tmp_path):
    """``prefzoo train --callback NAME`` as a user runs it: the three built-in names load (the run goes on to the
    missing model), and an unknown name is one error line listing them."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("1+2=\n")
    ok = _cli_train(tmp_path, f"win-rate:prompts={prompts}", "reference-sync:sync_steps=2", "early-stopping")
    assert ok.returncode != 0 and "--callback" not in ok.stderr and "--model" in ok.stderr.splitlines()[-1], ok.stderr
    bad = _cli_train(tmp_path, "no-such-callback")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert bad.stderr.splitlines()[-1] == (
        "prefzoo train: error: --callback 'no-such-callback': cannot load it (LookupError: no callback named "
        "'no-such-callback' (known: early-stopping, reference-sync, win-rate); or give module:Class); give an "
        "importable module:Class, a built-in (early-stopping, reference-sync, win-rate) or an entry point of group "
        "'prefzoo.callbacks'"
    )

