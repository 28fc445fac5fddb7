"""The start-of-run data report: detected format, chat template, one decoded pair, rows dropped or truncated."""

from __future__ import annotations

from typing import Any

__all__ = ["BOUNDARY", "decoded_example", "describe_data"]

BOUNDARY = " ‖ "  # printed between the prompt and a completion: where the trained tokens start


def decoded_example(tokenizer: Any, row: dict[str, Any]) -> list[str]:
    """One tokenized pair (list, unpaired example) decoded as the model sees it (special tokens kept), the
    prompt/completion boundary marked."""
    prompt = tokenizer.decode(row["prompt_ids"], skip_special_tokens=False)
    if "completion_ids" in row:
        comps = row["completion_ids"]
        if "label" in row:  # unpaired
            tag = "desirable" if row["label"] else "undesirable"
            return [f"  {tag + ':':12}{prompt!r}{BOUNDARY}{tokenizer.decode(comps, skip_special_tokens=False)!r}"]
        scores = row.get("scores") or [None] * len(comps)
        return [
            f"  #{k} {'' if s is None else f'(score {s:g}) '}{prompt!r}{BOUNDARY}"
            f"{tokenizer.decode(c, skip_special_tokens=False)!r}"
            for k, (c, s) in enumerate(zip(comps, scores, strict=True))
        ]
    chosen = tokenizer.decode(row["chosen_ids"], skip_special_tokens=False)
    rejected = tokenizer.decode(row["rejected_ids"], skip_special_tokens=False)
    return [
        f"  chosen:   {prompt!r}{BOUNDARY}{chosen!r}",
        f"  rejected: {prompt!r}{BOUNDARY}{rejected!r}",
    ]


def describe_data(tokenizer: Any, train_tok: Any, stats: dict[str, Any], template: str) -> list[str]:
    """Lines for the start of a run (the trainer prefixes each with ``prefzoo train:``)."""
    fmt = stats.get("train", {}).get("format") or "given as tokenized or normalized pairs"
    lines = [
        f"data format {fmt}; chat template: {template} (conversations are templated, string prompts used as given)",
        f"example {train_tok[0]['id']} (prompt{BOUNDARY}completion, special tokens shown):",
        *decoded_example(tokenizer, train_tok[0]),
    ]
    for split, s in stats.items():
        lines += [f"{split}: {e}" for e in s.get("examples", [])]
    return lines
