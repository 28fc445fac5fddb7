"""`prefzoo eval` input errors are one line naming the fix (issue 16, "Clear errors")."""

from __future__ import annotations

import sys

from prefzoo.cli.main import main


def test_lm_eval_without_the_extra_names_it(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` now fails as if it were not installed
    rc = main(["eval", "--lm-eval", "--model", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "pip install 'prefzoo[eval]'" in err and "ModuleNotFoundError" not in err


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
