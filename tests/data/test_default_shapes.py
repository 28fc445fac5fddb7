"""The default task's list data (K = 4 drafts ranked by the oracle) and unpaired data (desirable = exact)."""

from __future__ import annotations

import pytest

from prefzoo.data import synthetic
from prefzoo.model import load_default_task


@pytest.fixture(scope="module")
def task():
    return load_default_task(seed=0)


def test_lists_are_four_distinct_drafts_ranked_by_the_oracle(task):
    train, eval_ = task.data("lists")
    assert len(train) == len(task.train) and len(eval_) == len(task.eval)  # the same prompts as the pairs
    assert train["prompt"] == task.train["prompt"]
    for row in train:
        comps, scores = row["completions"], row["scores"]
        assert len(comps) == 4 == len(set(comps))
        for i in range(4):
            assert scores[i] == -synthetic.distance(row["prompt"], comps[i])
            for j in range(4):
                if scores[i] > scores[j]:
                    assert synthetic.judge(row["prompt"], comps[i], comps[j]) == 1.0


def test_unpaired_labels_are_the_oracles_exactness(task):
    train, _ = task.data("unpaired")
    assert len(train) == 2 * len(task.train)
    assert train["label"] == [synthetic.distance(p, c) == 0 for p, c in zip(train["prompt"], train["completion"],
                                                                             strict=True)]  # fmt: skip
    assert 0.2 < sum(train["label"]) / len(train) < 0.4  # DRAFT_PROBS: 30% of drafts are exact


def test_unknown_default_data_is_one_line(capsys):
    from prefzoo.cli.main import main

    assert main(["train", "--dataset", "default:triples"]) == 2
    err = capsys.readouterr().err
    assert "default:lists" in err and "default:unpaired" in err and err.count("\n") == 1
