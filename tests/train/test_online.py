"""On-policy training (--online): sample n completions per prompt, judge them, train any loss on the result.

On the embedded default task's warmed-up model and addition prompts, judged by the exact oracle.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import prefzoo
from prefzoo.judge import registry as J
from prefzoo.registry import list_losses, loss_spec
from prefzoo.train import Callback
from prefzoo.train.online import OnlineError, rows_to_unpaired
from prefzoo.types import Shape
from tests.train.helpers import base_config, max_param_diff, run_inprocess, run_processes


@pytest.fixture(scope="module")
def task() -> Any:
    from prefzoo.model import load_default_task

    return load_default_task(seed=0, progress=False)


@pytest.fixture(scope="module")
def prompts_file(task: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("online") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in task.train["prompt"][:64]))
    return path


def online(task: Any, prompts: Path, out: Path, **kw: Any) -> dict[str, Any]:
    cfg = base_config(task.model_dir, prompts, out, online=True, loss="mml", samples_per_prompt=4,
                      max_new_tokens=6, per_device_batch_size=4, max_steps=2, lr=1e-3)  # fmt: skip
    cfg.update(kw)
    return cfg


def rounds(out: Path) -> list[dict[str, Any]]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "online/round" in r]


def test_online_trains_on_judged_samples(task: Any, prompts_file: Path, tmp_path: Path) -> None:
    result = run_inprocess(online(task, prompts_file, tmp_path, max_steps=3, save_steps=1))
    assert result.global_step == 3 and result.final_dir is not None
    logged = rounds(tmp_path)
    assert [r["online/round"] for r in logged] == [0.0, 1.0, 2.0]  # --online-every 1: a round per step
    for r in logged:
        assert r["online/prompts"] == 4 and r["online/samples"] == 16 and r["online/skipped_prompts"] == 0
        assert 0 <= r["online/all_tied_fraction"] <= 1 and r["online/generation_tokens_per_s"] > 0
        assert r["online/score_spread"] > 0  # the sampled policy's answers differ in quality
    assert all(h["loss"] == h["loss"] for h in result.history)  # finite losses
    saved = json.loads((tmp_path / "checkpoints" / "step-00000003" / "online.json").read_text())
    assert saved["round"] == 2 and len(saved["rows"]) == 4
    assert all(len(r["completions"]) == 4 and r["scores"] == sorted(r["scores"], reverse=True) for r in saved["rows"])


def test_semi_online_samples_every_n_steps(task: Any, prompts_file: Path, tmp_path: Path) -> None:
    run_inprocess(online(task, prompts_file, tmp_path, max_steps=4, online_every=2))
    logged = rounds(tmp_path)
    assert [r["online/round"] for r in logged] == [0.0, 1.0]
    assert [r["online/prompts"] for r in logged] == [8.0, 8.0]  # one micro-batch of prompts per step of the round


def test_resume_mid_round_equals_uninterrupted(task: Any, prompts_file: Path, tmp_path: Path) -> None:
    kw: dict[str, Any] = dict(max_steps=4, online_every=2, save_steps=1)
    whole = run_inprocess(online(task, prompts_file, tmp_path / "whole", **kw))
    cut = online(task, prompts_file, tmp_path / "cut", **kw)
    first = run_inprocess({**cut, "stop_after_steps": 3})  # stops inside round 1 (steps 3-4)
    assert first.stopped_early and first.global_step == 3
    resumed = run_inprocess({**cut, "resume": "auto"})
    assert resumed.global_step == 4
    sd = lambda r: {k: v.detach().float() for k, v in r.model.state_dict().items()}  # noqa: E731
    assert max_param_diff(sd(whole), sd(resumed)) < 1e-6
    assert [r["online/round"] for r in rounds(tmp_path / "cut")] == [0.0, 1.0]  # round 1 was not sampled again


def _judge_plugin(factory: Any) -> Any:
    mod = types.SimpleNamespace()

    @prefzoo.hookimpl
    def prefzoo_register_judges() -> list[Any]:
        return [J.JudgeSpec(name="flaky", factory=factory)]

    mod.prefzoo_register_judges = prefzoo_register_judges
    return mod


class Flaky:
    """The oracle, except that it raises on prompts ending in an odd digit before '=' ... for every 2nd such prompt."""

    name = "flaky"

    def __init__(self, fail: str = "odd") -> None:
        from prefzoo.judge.builtin import OracleJudge

        self.oracle, self.fail = OracleJudge(), fail

    def __call__(self, prompts: list[str], c1: list[str], c2: list[str]) -> list[float]:
        bad = [p for p in prompts if self.fail == "all" or int(p.rstrip("=")[-1]) % 2]
        if bad:
            raise TimeoutError(f"judge timed out on {bad[0]!r}")
        return self.oracle(prompts, c1, c2)


def test_judge_failures_are_counted_skips(task: Any, prompts_file: Path, tmp_path: Path) -> None:
    J.reset_judge_registry(J.build_judge_registry(extra_plugins=[("t", _judge_plugin(Flaky))], autoload=False))
    try:
        run_inprocess(online(task, prompts_file, tmp_path / "some", judge="flaky", max_steps=2, judge_max_skip=1.0))
        logged = rounds(tmp_path / "some")
        assert sum(r["online/skipped_prompts"] for r in logged) > 0
        assert all(r["online/train_rows"] == r["online/prompts"] - r["online/skipped_prompts"] for r in logged)
        with pytest.raises(OnlineError, match=r"judge 'flaky' failed on 4 of 4 prompts.*TimeoutError"):
            run_inprocess(online(task, prompts_file, tmp_path / "all", judge="flaky", judge_params=["fail=all"]))
    finally:
        J.reset_judge_registry()


def test_bad_online_settings_fail_before_the_model_loads(task: Any, prompts_file: Path, tmp_path: Path) -> None:
    from prefzoo.train.config import ConfigError

    with pytest.raises(ConfigError, match="--judge 'nosuch'"):
        run_inprocess(online(task, prompts_file, tmp_path / "a", judge="nosuch"))
    with pytest.raises(ConfigError, match=r"prompts only.*--online"):
        run_inprocess(online(task, prompts_file, tmp_path / "b", online=False))
    with pytest.raises(ConfigError, match="--pairs-from-lists"):
        run_inprocess(online(task, prompts_file, tmp_path / "c", loss="dpo"))
    with pytest.raises(ConfigError, match=r"--max-new-tokens: max_new_tokens=64 leaves no room for a prompt"):
        run_inprocess(online(task, prompts_file, tmp_path / "e", max_new_tokens=64))  # the model's context is 64
    with pytest.raises(ConfigError, match="--precompute-ref with --online"):
        run_inprocess(online(task, prompts_file, tmp_path / "d", loss="dpo", pairs_from_lists="best-worst",
                             precompute_ref=True))  # fmt: skip


def test_rows_to_unpaired_labels_by_score() -> None:
    rows = [{"id": "a", "prompt": "p", "completions": ["x", "y", "z"], "scores": [1.0, 0.5, 0.0]},
            {"id": "b", "prompt": "q", "completions": ["u", "v"], "scores": [0.5, 0.5]}]  # fmt: skip
    got = rows_to_unpaired(rows, None)  # above the prompt's mean desirable, at it left out
    assert [(r["completion"], r["label"]) for r in got] == [("x", True), ("z", False)]
    got = rows_to_unpaired(rows, 0.5)
    assert [(r["completion"], r["label"]) for r in got] == [("x", True), ("y", True), ("z", False), ("u", True),
                                                            ("v", True)]  # fmt: skip


def _online_losses() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name in list_losses():
        spec = loss_spec(name)
        if spec.accepts(Shape.LIST):
            out.append((name, {}))
        elif spec.accepts(Shape.PAIR):
            out.append((name, {"pairs_from_lists": "best-worst"}))
        elif Shape.UNPAIRED in spec.shapes:
            out.append((name, {}))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("loss", "kw"), _online_losses())
def test_every_loss_completes_online_steps(task: Any, prompts_file: Path, tmp_path: Path, loss: str, kw: Any) -> None:
    result = run_inprocess(online(task, prompts_file, tmp_path, loss=loss, max_steps=1, eval_fraction=0.0, **kw))
    assert result.global_step == 1 and result.skipped_steps == 0
    assert torch.isfinite(torch.tensor(result.history[-1]["loss"]))


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_equal_one_with_same_global_batch(task: Any, prompts_file: Path, tmp_path: Path) -> None:
    kw: dict[str, Any] = dict(loss="mmpo-list", max_steps=2, generation_batch_size=2)  # gathered normalisation
    two = run_processes(online(task, prompts_file, tmp_path / "two", per_device_batch_size=2, **kw), 2)
    one = run_processes(online(task, prompts_file, tmp_path / "one", per_device_batch_size=4, **kw), 1)
    assert max_param_diff(two["params"], one["params"]) < 1e-5
    for a, b in zip(two["history"], one["history"], strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-5


class Phases(Callback):
    """The loop's phases a run passes through, with the step and epoch it was at (hooks every run calls)."""

    HOOKS = ("on_train_begin", "on_step_begin", "on_batch", "on_before_optimizer_step", "on_step_end", "on_log",
             "on_save_files", "on_save", "on_evaluate", "on_epoch_end", "on_train_end")  # fmt: skip

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        for hook in self.HOOKS:
            setattr(self, hook, lambda state, *_, hook=hook: self.calls.append((hook, state.global_step, state.epoch)))


def test_offline_and_online_runs_go_through_the_same_loop(task: Any, tmp_path: Path) -> None:
    # 8 distinct prompts, 4 per step: 2 steps per pass; 3 steps cross a pass end (step 2) and end mid-pass (step 3)
    rows = list({r["prompt"]: r for r in task.train}.values())[:8]
    pairs, prompts = tmp_path / "pairs.jsonl", tmp_path / "prompts.jsonl"
    pairs.write_text("".join(json.dumps({k: r[k] for k in ("prompt", "chosen", "rejected")}) + "\n" for r in rows))
    prompts.write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in rows))
    kw: dict[str, Any] = dict(max_steps=3, save_steps=1, logging_steps=2)
    seen = {}
    for name, cfg in (("offline", {**online(task, pairs, tmp_path / "off", **kw), "online": False}),
                      ("online", online(task, prompts, tmp_path / "on", **kw))):  # fmt: skip
        rec = Phases()
        run_inprocess(cfg, callbacks=[rec])
        seen[name] = rec.calls
    assert seen["online"] == seen["offline"]
    ends = [(step, epoch) for hook, step, epoch in seen["online"] if hook == "on_epoch_end"]
    assert ends == [(2, 1), (3, 2)]  # the pass over the prompts ends at step 2; the run ends in the second


def test_a_round_is_prepared_in_memory_without_datasets(task: Any, prompts_file: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import datasets

    calls: list[str] = []
    cache = Path(datasets.config.HF_DATASETS_CACHE)
    files: list[set[Path]] = []  # cache files after setup, at the end

    class Spy(Callback):  # every datasets pass and cache file after the run's setup is counted
        def on_train_begin(self, state: Any) -> None:
            files.append(set(cache.rglob("cache-*.arrow")))
            for cls, name in ((datasets.Dataset, "map"), (datasets.Dataset, "filter"), (datasets.Dataset, "from_list"),
                              (datasets.Dataset, "from_dict")):  # fmt: skip
                real = getattr(cls, name)

                def spy(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
                    calls.append(_name)
                    return _real(*a, **k)

                monkeypatch.setattr(cls, name, spy)

        def on_train_end(self, state: Any) -> None:
            files.append(set(cache.rglob("cache-*.arrow")))

    for loss, kw in (("mml", {}), ("dpo", {"pairs_from_lists": "best-worst"}), ("kto", {})):
        run_inprocess(online(task, prompts_file, tmp_path / loss, loss=loss, max_steps=2, **kw), callbacks=[Spy()])
        monkeypatch.undo()
    assert calls == []  # 2 rounds each of lists, pairs from lists and unpaired examples: not one datasets pass
    assert len(files) == 6 and files[0::2] == files[1::2]  # no cache file written during the rounds


def _rows() -> list[dict[str, Any]]:
    """Judged lists as a round makes them: distinct, tied, identical and over-long completions."""
    return [
        {"id": "r0:p0", "prompt": "12+7=", "completions": ["19", "18", "1"], "scores": [2.0, 1.0, 0.0]},
        {"id": "r0:p1", "prompt": "3+4=", "completions": ["7", "7"], "scores": [1.0, 1.0]},  # identical: dropped
        {"id": "r0:p2", "prompt": "5+5=", "completions": ["10", "11"], "scores": [0.5, 0.5]},  # tied: no pair
        {"id": "r0:p3", "prompt": "40+2=", "completions": ["42 and more", "4"], "scores": [1.0, 0.0]},  # truncated
    ]


@pytest.mark.parametrize("how", ["lists", "best-worst", "all-pairs", "unpaired"])
def test_round_rows_tokenize_as_the_dataset_path(task: Any, how: str) -> None:
    import dataclasses

    import datasets

    from prefzoo.data.shapes import LISTS, PAIRS, UNPAIRED
    from prefzoo.model.context import ContextLimits
    from prefzoo.train.config.sections import DataSection, EvaluationSection
    from prefzoo.train.setup.shape_plan import ShapePlan
    from prefzoo.train.setup.splits import SplitSettings, prepare_datasets, prepare_rows

    tok = task.load_tokenizer()
    rows = _rows()
    plan = {"lists": ShapePlan(LISTS, LISTS), "unpaired": ShapePlan(UNPAIRED, UNPAIRED, kl=True)}.get(
        how, ShapePlan(LISTS, PAIRS, pairs_from_lists=how))
    if how == "unpaired":
        rows = rows_to_unpaired(rows, None)
    limits = ContextLimits(8, 3, (8, 4), 64, "test")  # completions cut at 3 tokens; 4 asked for
    cfg = SplitSettings(DataSection(), EvaluationSection(eval_fraction=0.0), seed=0)
    want, _, stats = prepare_datasets(cfg, tok, datasets.Dataset.from_list(rows), None, limits, plan)
    got, got_stats, tied = prepare_rows(tok, rows, limits, plan)
    assert got == list(want) and len(got) > 0
    assert {**dataclasses.asdict(got_stats), **({"tied_lists": tied} if tied else {})} == {
        k: v for k, v in stats["train"].items() if k != "format"}
    assert got_stats.completion_truncated > 0 and (got_stats.identical > 0 or how == "unpaired" or tied > 0)
