"""Evaluation: win-rate with pluggable judges, reward accuracy, and the lm-eval bridge (heavy imports stay lazy)."""

from prefzoo.eval.harness import PAPER_TASKS, format_table, run_lm_eval
from prefzoo.eval.reward import reward_accuracy
from prefzoo.eval.winrate import WinRateResult, length_controlled_win_rate, win_rate
from prefzoo.judge import Judge, JudgeSpec, UnknownJudgeError, generate, get_judge, list_judges, reset_judge_registry

__all__ = [
    "PAPER_TASKS",
    "Judge",
    "JudgeSpec",
    "UnknownJudgeError",
    "WinRateResult",
    "format_table",
    "generate",
    "get_judge",
    "length_controlled_win_rate",
    "list_judges",
    "reset_judge_registry",
    "reward_accuracy",
    "run_lm_eval",
    "win_rate",
]
