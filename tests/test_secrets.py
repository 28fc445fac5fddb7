"""redact(): a value under a key named like a secret never reaches a card, a tracker or a log line."""

from __future__ import annotations

import pytest

from prefzoo._secrets import REDACTED, is_secret_name, redact

SECRETS = ["api_key", "hf_token", "openaiApiKey", "OPENAI_API_KEY", "password", "db_passwd", "auth", "Authorization",
           "aws_secret", "credentials", "key", "private-key"]  # fmt: skip


@pytest.mark.parametrize("name", SECRETS)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["max_new_tokens", "tokens_per_second", "tokenizer", "keep_dropout", "monkey",
                                  "logits_to_keep", "judge_params", "author", "beta"])  # fmt: skip
def test_names_that_only_look_alike(name):
    assert not is_secret_name(name)


def test_redact_walks_mappings_lists_and_key_value_strings():
    cfg = {
        "judge_params": ["api_key=sk-1,2 3", "tie_tolerance=0.1"],  # one option: all after '=' is its value
        "callbacks": ["mod:Cls:every=2,token=abc", {"callback": "x", "password": "p", "n": 1}],
        "loss_params": {"beta": 0.1, "hf_token": None},
        "lr": 1e-3,
        "model": "org/name",
    }
    assert redact(cfg) == {
        "judge_params": [f"api_key={REDACTED}", "tie_tolerance=0.1"],
        "callbacks": [f"mod:Cls:every=2,token={REDACTED}", {"callback": "x", "password": REDACTED, "n": 1}],
        "loss_params": {"beta": 0.1, "hf_token": None},  # nothing set: nothing to hide
        "lr": 1e-3,
        "model": "org/name",
    }
    assert cfg["judge_params"][0] == "api_key=sk-1,2 3"  # the run's own values are left alone
