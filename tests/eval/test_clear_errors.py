"""`prefzoo eval` input errors are one line naming the fix (issue 16, "Clear errors")."""

from __future__ import annotations

import json
import sys

from prefzoo.cli.main import main


def test_lm_eval_without_the_extra_names_it(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` now fails as if it were not installed
    rc = main(["eval", "--lm-eval", "--model", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert 'pip install -e ".[eval]" from the prefzoo clone' in err and "ModuleNotFoundError" not in err


def test_win_rate_lengths_are_the_generated_tokens():
    """A tokenizer whose decode adds spaces between characters made re-tokenized lengths exceed --max-new-tokens."""
    from prefzoo.eval.winrate import win_rate
    from tests.support.tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    tok.backend_tokenizer.decoder = None  # no decoder: "12" decodes as "1 2"
    assert tok.decode(tok("12").input_ids) == "1 2"
    policy, baseline = build_model(tok, seed=1).eval(), build_model(tok, seed=2).eval()
    prompts = [f"{a}+{a}=" for a in range(10, 20)]
    res = win_rate(policy, baseline, tok, prompts, "oracle", max_new_tokens=4, batch_size=5)
    assert all(0 <= n <= 4 for n in res.policy_lengths + res.baseline_lengths)
    assert res.summary()["mean_policy_length"] <= 4
    for text, n in zip(res.policy_completions, res.policy_lengths, strict=True):
        assert len(text.replace(" ", "")) <= n  # each generated character token is one counted token


def _no_default_task(monkeypatch):
    import prefzoo.model

    def refuse(*a, **k):
        raise AssertionError("the default task was mixed into a user's evaluation")

    monkeypatch.setattr(prefzoo.model, "load_default_task", refuse)


def test_reward_accuracy_of_a_user_model_needs_a_baseline(monkeypatch, capsys, causal_dirs, tmp_path):
    """It used to take the default task's character-level model as the reference (IndexError, or a wrong number)."""
    _no_default_task(monkeypatch)
    pol, base = map(str, causal_dirs)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(json.dumps({"prompt": f"{a}+{a}=", "chosen": str(2 * a), "rejected": "0"}) + "\n" for a in (1, 2))
    )
    data = ["eval", "--model", pol, "--reward-accuracy", "--dataset", str(pairs), "--loss", "dpo"]
    rc = main(data)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "--reward-accuracy with --loss dpo needs a reference model" in err and "--baseline PATH" in err
    out = tmp_path / "ra.json"
    assert main([*data, "--baseline", base, "--output", str(out)]) == 0
    assert json.loads(out.read_text())["reward_accuracy"]["reference"] == base


def test_win_rate_of_a_user_model_on_user_prompts_needs_a_baseline(monkeypatch, capsys, causal_dirs, tmp_path):
    _no_default_task(monkeypatch)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("1+1=\n")
    rc = main(["eval", "--model", str(causal_dirs[0]), "--win-rate", "--prompts", str(prompts)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--win-rate compares" in err and "--baseline PATH" in err


def test_a_user_model_with_another_tokenizer_is_not_evaluated_on_the_default_task(capsys, tmp_path):
    from prefzoo.testing import tiny_causal_lm

    model, tok = tiny_causal_lm(seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    tok.add_tokens(["<user>"])
    model.resize_token_embeddings(len(tok))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    capsys.readouterr()  # the save's progress bar
    rc = main(["eval", "--model", str(tmp_path), "--reward-accuracy"])
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip() and "Loading weights" not in x]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("prefzoo eval: error: ")
    err = lines[0]
    assert "does not use the default task's tokenizer" in err and "--baseline PATH" in err
