"""The bundled synthetic task: the exact oracle, the splits, the pairs and the character tokenizer."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from prefzoo.data import synthetic as S


@pytest.mark.parametrize(
    ("prompt", "c1", "c2", "expected"),
    [
        ("12+35=", "47", "48", 1.0),  # exact beats off-by-one
        ("12+35=", "49", "46", 0.0),  # |2| loses to |1|
        ("12+35=", "46", "48", 0.5),  # equal distance: tie
        ("12+35=", "47", "47", 0.5),
        ("12+35=", "99", "4x", 1.0),  # malformed loses to any well-formed answer
        ("12+35=", "", "90", 0.0),
        ("12+35=", "a", "b", 0.5),  # two malformed answers tie
        ("12+35=", " 47 ", "47", 0.5),  # surrounding whitespace is ignored
        ("rev abc=", "cba", "cbb", 1.0),
        ("rev abc=", "abc", "cba", 0.0),
        ("rev abc=", "x", "y", 0.5),
    ],
)
def test_oracle_judge_hand_cases(prompt: str, c1: str, c2: str, expected: float) -> None:
    assert S.judge(prompt, c1, c2) == expected


def test_oracle_is_antisymmetric() -> None:
    rng = random.Random(0)
    for _ in range(300):
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        x, y = str(a + b + rng.randint(-4, 4)), rng.choice([str(a + b + rng.randint(-4, 4)), "z", ""])
        assert S.judge(S.addition_prompt(a, b), x, y) == 1.0 - S.judge(S.addition_prompt(a, b), y, x)


def test_distance_and_parse_errors() -> None:
    assert S.distance("10+10=", "23") == 3.0
    assert S.distance("10+10=", "2 3") == float("inf")
    with pytest.raises(ValueError, match="not an addition prompt"):
        S.distance("hello", "3")


def test_splits_are_disjoint_and_deterministic() -> None:
    sp = S.make_splits(0)
    held, ev, tr, warm = (set(x) for x in (sp.heldout, sp.pref_eval, sp.pref_train, sp.warmup))
    assert len(held) == 200 and len(ev) == 200 and len(tr) == 600
    assert not held & ev and not held & tr and not held & warm and not ev & warm
    assert tr <= warm  # preference prompts were also seen in the warm-up (with noisy answers)
    assert not set(sp.rev_heldout) & set(sp.rev_warmup)
    assert S.make_splits(0) == sp
    assert S.make_splits(1).heldout != sp.heldout


def test_pairs_are_ranked_by_the_oracle_and_symmetric() -> None:
    sp = S.make_splits(0)
    rows = S.make_pairs(sp.pref_train * 5, seed=0, prefix="t")
    assert rows == S.make_pairs(sp.pref_train * 5, seed=0, prefix="t")
    assert rows != S.make_pairs(sp.pref_train * 5, seed=1, prefix="t")
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert S.judge(r["prompt"], r["chosen"], r["rejected"]) == 1.0
    lower = sum(int(r["chosen"]) < int(r["rejected"]) for r in rows) / len(rows)
    assert 0.45 < lower < 0.55  # no "the smaller answer wins" shortcut
    exact = sum(S.distance(r["prompt"], r["chosen"]) == 0 for r in rows) / len(rows)
    assert 0.5 < exact < 0.7


def test_warmup_noise_makes_plus_one_the_mode() -> None:
    rng = random.Random(0)
    counts = Counter(S.noisy_answer(50, rng) - 50 for _ in range(20_000))
    assert counts.most_common(1)[0][0] == 1
    assert abs(counts[0] / 20_000 - S.NOISE_PROBS[0]) < 0.02


def test_character_tokenizer_contract() -> None:
    pytest.importorskip("transformers")
    from prefzoo.data.default import build_tokenizer

    tok = build_tokenizer()
    ids = tok("rev abc=").input_ids
    assert ids[0] == tok.bos_token_id and len(ids) == 1 + len("rev abc=")
    assert tok("47", add_special_tokens=False).input_ids == [tok.convert_tokens_to_ids(c) for c in "47"]
    assert (
        tok.decode([*tok("47", add_special_tokens=False).input_ids, tok.eos_token_id], skip_special_tokens=True) == "47"
    )
    assert tok.decode(tok("rev abc=").input_ids, skip_special_tokens=True) == "rev abc="
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert not getattr(tok, "chat_template", None)
