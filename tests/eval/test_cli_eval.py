"""`prefzoo eval` end to end on tiny local models (the default-task path is a slow test)."""

from __future__ import annotations

import json

import pytest

from prefzoo.cli.main import main

from .test_harness import _write_task


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "prompts.txt").write_text("10+10=\n12+30=\nrev abc=\n\n41+41=\n")
    rows = [{"prompt": f"{a}+{a}=", "chosen": str(2 * a), "rejected": str(2 * a + 3)} for a in range(10, 22)]
    (d / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_win_rate_with_oracle_and_reward_model(causal_dirs, classifier_dir, files, tmp_path, capsys) -> None:
    pol, base = map(str, causal_dirs)
    out = tmp_path / "wr.json"
    common = ["eval", "--model", pol, "--baseline", base, "--win-rate", "--prompts", str(files / "prompts.txt")]
    assert main([*common, "--max-new-tokens", "4", "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    assert (
        res["win_rate"]["n"] == 4 and res["win_rate"]["judge"] == "oracle" and res["win_rate"]["decoding"] == "greedy"
    )
    assert "reward_accuracy" not in res and "lm_eval" not in res
    rm = ["--judge", "reward-model", "--judge-arg", f"model_path={classifier_dir}", "--output", str(out)]
    assert main([*common, "--max-new-tokens", "4", *rm]) == 0
    res = json.loads(out.read_text())["win_rate"]
    assert res["judge"] == "reward-model" and res["wins"] + res["ties"] + res["losses"] == 4
    assert "win-rate vs" in capsys.readouterr().out


def test_reward_accuracy_reference_free_and_with_reference(causal_dirs, files, tmp_path) -> None:
    pol, base = map(str, causal_dirs)
    out = tmp_path / "ra.json"
    data = ["--reward-accuracy", "--dataset", str(files / "pairs.jsonl")]
    assert main(["eval", "--model", pol, *data, "--loss", "simpo", "--output", str(out)]) == 0
    ra = json.loads(out.read_text())["reward_accuracy"]
    assert ra["pairs"] == 12 and ra["loss"] == "simpo" and ra["reference"] is None
    args = ["eval", "--model", pol, "--reference", base, *data, "--loss", "dpo", "--loss-param", "beta=0.5"]
    assert main([*args, "--output", str(out)]) == 0
    ra = json.loads(out.read_text())["reward_accuracy"]
    assert ra["reference"] == base and ra["tie_rate"] == 0.0


def test_lm_eval_on_a_local_task(causal_dirs, tmp_path) -> None:
    pytest.importorskip("lm_eval")
    yml = _write_task(tmp_path)
    out = tmp_path / "le.json"
    assert main(["eval", "--model", str(causal_dirs[0]), "--lm-eval", "--tasks", str(yml), "--output", str(out)]) == 0
    le = json.loads(out.read_text())["lm_eval"]
    assert "prefzoo_tiny_add" in le["tasks"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--win-rate", "--judge", "oracel", "--model", "x", "--baseline", "y"], "did you mean 'oracle'"),
        (["--lm-eval"], "--lm-eval needs --model"),
        (["--reward-accuracy", "--loss", "dpoo", "--model", "x"], "unknown loss 'dpoo'"),
        (["--judge-param", "nokey", "--win-rate", "--model", "x", "--baseline", "y"], "expected KEY=VALUE"),
    ],
)
def test_user_errors_are_one_line_exit_2(argv, message, capsys) -> None:
    assert main(["eval", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_bad_prompts_file_and_judge_list(causal_dirs, tmp_path, capsys) -> None:
    pol, base = map(str, causal_dirs)
    assert main(["eval", "--model", pol, "--baseline", base, "--win-rate", "--prompts", str(tmp_path / "no.txt")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["eval", "--judge", "list"]) == 0
    listing = capsys.readouterr().out
    assert "oracle" in listing and "reward-model" in listing


@pytest.mark.slow
def test_no_arguments_evaluates_the_default_starting_policy(tmp_path) -> None:
    out = tmp_path / "default.json"
    assert main(["eval", "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["win_rate"]["win_rate"] == 0.5  # the starting policy against itself
    assert res["win_rate"]["retention"] >= 0.9
    assert res["reward_accuracy"]["pairs"] == 200


def test_the_default_task_evaluation_is_chosen_by_capability_not_by_name(files, capsys) -> None:
    """A judge declaring grades_default_task may be named without --win-rate (like the oracle); others may not."""
    import types

    import prefzoo
    from prefzoo.judge import registry as J

    def plugin(name: str, grades: bool) -> types.SimpleNamespace:
        spec = J.JudgeSpec(name=name, factory=J.get_judge_registry().get("oracle").factory, grades_default_task=grades)
        return types.SimpleNamespace(prefzoo_register_judges=prefzoo.hookimpl(lambda: [spec]))

    plugins = [("exact", plugin("exact-task-judge", True)), ("plain", plugin("plain-judge", False))]
    J.reset_judge_registry(J.build_judge_registry(extra_plugins=plugins, autoload=False))
    try:
        data = ["--reward-accuracy", "--dataset", str(files / "pairs.jsonl"), "--model", str(files / "no-model")]
        data += ["--loss", "simpo"]  # reference-free: a user model with dpo would need --baseline
        assert main(["eval", "--judge", "plain-judge", *data]) == 2
        assert "--judge is used by --win-rate" in capsys.readouterr().err
        assert main(["eval", "--judge", "exact-task-judge", *data]) == 2  # gets past the judge, to the missing model
        err = capsys.readouterr().err
        assert "--judge is used" not in err and "--model" in err and "no such folder" in err
    finally:
        J.reset_judge_registry()
