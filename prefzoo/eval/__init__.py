"""Evaluation: win-rate with pluggable judges, reward accuracy, and the lm-eval bridge (heavy imports stay lazy)."""

from prefzoo.eval.judges import Judge, JudgeSpec, UnknownJudgeError, get_judge, list_judges, reset_judge_registry

__all__ = ["Judge", "JudgeSpec", "UnknownJudgeError", "get_judge", "list_judges", "reset_judge_registry"]
