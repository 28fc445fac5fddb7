"""The judge registry (plugins through prefzoo_register_judges) and the built-in oracle and reward-model judges."""

from __future__ import annotations

import types

import pytest

import prefzoo
from prefzoo.judge import registry as J
from prefzoo.registry import RegistryError


def _plugin(*names: str, factory=None):
    mod = types.SimpleNamespace()

    @prefzoo.hookimpl
    def prefzoo_register_judges():
        return [J.JudgeSpec(name=n, factory=factory or (lambda: lambda p, a, b: [0.5] * len(p))) for n in names]

    mod.prefzoo_register_judges = prefzoo_register_judges
    return mod


def test_builtins_registered() -> None:
    reg = J.build_judge_registry(autoload=False)
    assert {"oracle", "reward-model"} <= set(reg.names())
    assert reg.specs["oracle"].plugin == "prefzoo.judge.builtin"


def test_unknown_judge_suggests_close_names() -> None:
    with pytest.raises(J.UnknownJudgeError, match="did you mean 'oracle'"):
        J.get_judge("oracel")


def test_duplicate_name_names_both_plugins() -> None:
    with pytest.raises(RegistryError, match=r"'oracle'.*prefzoo.judge.builtin.*my-plugin"):
        J.build_judge_registry(extra_plugins=[("my-plugin", _plugin("oracle"))], autoload=False)


def test_third_party_judge_plugin_is_usable_by_name() -> None:
    class LongerWins:
        name = "longer"

        def __call__(self, prompts, c1, c2):
            return [0.5 if len(a) == len(b) else float(len(a) > len(b)) for a, b in zip(c1, c2, strict=True)]

    reg = J.build_judge_registry(extra_plugins=[("mine", _plugin("longer", factory=LongerWins))], autoload=False)
    J.reset_judge_registry(reg)
    try:
        judge = J.get_judge("longer")
        assert judge(["p", "p"], ["aa", "a"], ["a", "a"]) == [1.0, 0.5]
        assert "longer" in J.list_judges()
    finally:
        J.reset_judge_registry()


def test_broken_plugin_is_reported_not_fatal() -> None:
    bad = types.SimpleNamespace()

    @prefzoo.hookimpl
    def prefzoo_register_judges():
        raise ImportError("no such backend")

    bad.prefzoo_register_judges = prefzoo_register_judges
    reg = J.build_judge_registry(extra_plugins=[("broken", bad)], autoload=False)
    assert "oracle" in reg.names()
    assert [f.plugin for f in reg.failed] == ["broken"] and "no such backend" in reg.failed[0].error


def test_bad_judge_options_name_the_options() -> None:
    with pytest.raises(ValueError, match="model_path"):
        J.get_judge("reward-model", modle_path="x")
    with pytest.raises(ValueError, match="model_path"):
        J.get_judge("reward-model")


def test_oracle_judge_batch_and_foreign_prompts() -> None:
    oracle = J.get_judge("oracle")
    assert oracle(["10+10=", "10+10=", "rev ab="], ["20", "19", "ba"], ["21", "22", "ab"]) == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="only grades the bundled synthetic task"):
        oracle(["Write a poem"], ["a"], ["b"])
    with pytest.raises(ValueError, match="must match"):
        oracle(["10+10="], ["20"], [])


def test_reward_model_judge_matches_its_scores(classifier_dir) -> None:
    judge = J.get_judge("reward-model", model_path=str(classifier_dir), batch_size=3)
    prompts = ["10+10=", "12+13=", "rev abc=", "40+41=", "11+11="]
    c1, c2 = ["20", "25", "cba", "9", "22"], ["21", "26", "abc", "81", "22"]
    s1, s2 = judge.scores(prompts, c1), judge.scores(prompts, c2)
    assert len(set(s1)) > 1  # a random classifier still gives different scores
    verdicts = judge(prompts, c1, c2)
    assert verdicts[:4] == [float(a > b) for a, b in zip(s1[:4], s2[:4], strict=True)]
    assert verdicts[4] == 0.5  # identical completions tie
    # batching and padding must not change a score
    single = [judge.scores([p], [c])[0] for p, c in zip(prompts, c1, strict=True)]
    assert single == pytest.approx(s1, abs=1e-5)


def test_reward_model_judge_bad_path() -> None:
    with pytest.raises(ValueError, match="is not a folder"):
        J.get_judge("reward-model", model_path="/nonexistent/rm")


def test_llm_judge_is_position_debiased_and_batch_invariant(causal_dirs) -> None:
    judge = J.get_judge("llm", model_path=str(causal_dirs[0]), choices=(" a", " b"), batch_size=2)
    prompts = ["10+10=", "rev abc=", "12+13="]
    c1, c2 = ["20", "cba", "25"], ["21", "abc", "2"]
    v = judge(prompts, c1, c2)
    assert all(0.0 <= x <= 1.0 for x in v)
    assert judge(prompts, c2, c1) == pytest.approx([1.0 - x for x in v], abs=1e-6)  # both orders averaged
    assert judge(prompts, c1, c1) == [0.5, 0.5, 0.5]
    # the raw one-order probability is biased by position (a random LM has no reason to be fair)
    raw = judge.prob_first(prompts, c1, c1)
    assert any(abs(x - 0.5) > 1e-4 for x in raw)
    assert [judge.prob_first([p], [a], [b])[0] for p, a, b in zip(prompts, c1, c2, strict=True)] == pytest.approx(
        judge.prob_first(prompts, c1, c2), abs=1e-5
    )


def test_llm_judge_bad_options(causal_dirs) -> None:
    with pytest.raises(ValueError, match="must be a local causal-LM folder"):
        J.get_judge("llm", model_path="/no/such")
    with pytest.raises(ValueError, match="lacks \\{answer_b\\}"):
        J.get_judge("llm", model_path=str(causal_dirs[0]), template="{prompt} {answer_a}")
    with pytest.raises(ValueError, match="must differ"):
        J.get_judge("llm", model_path=str(causal_dirs[0]), choices=(" a", " a"))
