"""The sweep's own verdicts on an architecture that goes wrong in one layout only: a fast path that is wrong only in
the shared-prompt layout fails the architecture, and the run-start self-check is tried on that layout, where it
catches the fault (checked on the plain rows it would pass, and the sweep would report a silent wrong result)."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("transformers")

import prefzoo.model
import prefzoo.model.logps as logps
from prefzoo.testing.architectures import check_architecture


def test_a_fault_of_the_shared_layout_only_is_checked_on_that_layout(monkeypatch):
    sound = logps.shared_prompt_select

    def scaled(*args, **kw):  # hidden states of shared rows 1% off: log-probs wrong by far more than 1e-4 per token
        out, (h_sel, *rest) = sound(*args, **kw)
        return out, (h_sel * 1.01, *rest)

    monkeypatch.setattr(logps, "shared_prompt_select", scaled)
    res = check_architecture("llama")
    assert res.status == "fail" and res.errors["fused"] < 1e-4, res  # the plain layout is still right
    assert res.reason.startswith("shared-prompt layout differs from the plain rows"), res
    assert res.caught and res.reason.endswith("; the self-check catches it"), res


def test_a_fault_of_the_split_attention_only_is_checked_under_sdpa_and_caught(monkeypatch):
    """y_l queries that see every [x, y_l] key (no shifted causal mask) in the split attention: the eager shared
    layout stays right, the SDPA comparison fails, and the self-check (run under SDPA, on the split) stops it."""
    from prefzoo.model.fast import prompt as fastpath_prompt
    from tests.support.patching import patch_result

    def leaky(plan):
        plan.allowed = torch.ones_like(plan.allowed)

    patch_result(monkeypatch, fastpath_prompt, "split_plan", leaky)
    res = check_architecture("llama")
    assert res.status == "fail" and res.errors["shared"] < 1e-4 and res.errors["split"] > 1e-2, res
    assert res.reason.startswith("split shared-prompt attention differs from the plain rows"), res
    assert res.caught and res.reason.endswith("; the self-check catches it"), res


def test_a_fault_of_the_packed_rows_only_is_checked_on_them_and_caught(monkeypatch):
    """Flat outputs put back one slot off in the packed rows' split: the padded layouts stay right, the packed
    comparison fails, and the self-check, run as a packed run runs it, stops it."""
    from prefzoo.model.fast import packing
    from tests.support.patching import patch_result, roll_flat_slots

    patch_result(monkeypatch, packing, "flat_layout", roll_flat_slots)
    res = check_architecture("llama")
    assert res.status == "fail" and res.errors["split"] < 1e-4 and res.errors["packed"] > 1e-2, res
    assert res.reason.startswith("packed shared rows (one row, split) differs from the plain rows"), res
    assert res.caught and res.reason.endswith("; the self-check catches it"), res


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ValueError("no tiny config for it\nsecond line"), "cannot be built tiny (ValueError: no tiny config for it)"),
        (ImportError("needs einops\nsecond line"), "needs a package: needs einops"),
    ],
)
def test_an_architecture_that_cannot_be_built_is_a_skip_with_its_first_error_line(monkeypatch, error, reason):
    import prefzoo.testing.architectures as arch

    def fails(model_type):
        raise error

    monkeypatch.setattr(arch, "build_tiny", fails)
    res = check_architecture("llama")
    assert (res.model_type, res.status, res.reason) == ("llama", "skip", reason), res


def test_a_multimodal_class_is_a_skip_without_building_it(monkeypatch):
    import prefzoo.testing.architectures as arch

    monkeypatch.setattr(arch, "build_tiny", lambda model_type: pytest.fail("a multimodal model was built"))
    res = check_architecture("mllama")
    reason = "MllamaForCausalLM: needs a vision/audio/encoder input, not a text decoder"
    assert (res.model_type, res.status, res.reason) == ("mllama", "skip", reason), res


def test_a_model_that_shrinks_too_little_is_a_skip_naming_its_size(monkeypatch):
    import prefzoo.testing.architectures as arch

    monkeypatch.setattr(arch, "MAX_PARAMS", 1000)
    res = check_architecture("llama")
    assert (res.model_type, res.status) == ("llama", "skip"), res
    assert re.fullmatch(r"cannot be built tiny \(TinyBuildError: \d+\.\dM parameters after shrinking the known size "
                        r"fields \(limit 1,000\)\)", res.reason), res  # fmt: skip


def test_a_model_whose_own_forward_fails_is_a_skip(monkeypatch):
    import prefzoo.testing.architectures as arch

    def fails(model, batch):
        raise RuntimeError("no padded batches\nmore")

    monkeypatch.setattr(arch, "_model_logits", fails)
    res = check_architecture("llama")
    assert res.model_type == "llama" and res.status == "skip", res
    assert res.reason == "its own forward fails on a padded batch (RuntimeError)", res


def _nth_call_raises(monkeypatch, n: int, error: Exception) -> None:
    """The sweep's ``n``-th call of sequence_logps (1 fused, 2 chunked, 3 the shared layout) raises ``error``."""
    sound, calls = logps.sequence_logps, []

    def counted(*args, **kw):
        calls.append(1)
        if len(calls) == n:
            raise error
        return sound(*args, **kw)

    monkeypatch.setattr(prefzoo.model, "sequence_logps", counted)  # the name the sweep calls


def test_a_fast_path_that_cannot_run_fails_with_its_first_line(monkeypatch):
    _nth_call_raises(monkeypatch, 1, RuntimeError("shapes cannot be multiplied\nmore"))
    res = check_architecture("llama")
    assert res.status == "fail", res
    # only the sweep's copy of the fast path was broken: the self-check runs the real one, which is right
    assert res.reason == "fast path cannot run: RuntimeError: shapes cannot be multiplied; THE SELF-CHECK MISSES IT"


def test_refused_prompt_sharing_passes_with_the_reason_and_a_crash_in_it_fails(monkeypatch):
    from prefzoo.model.fast.prompt import SharedPromptError

    # a refusal as prefzoo/model/arch.py words it: its feature before the first ": ", a ": " inside, cut to 110
    _nth_call_raises(monkeypatch, 3, SharedPromptError(
        "share_prompt: llama's decoder takes no position_ids, so the rejected completion cannot restart at the "
        "prompt end: turn share_prompt off"))  # fmt: skip
    res = check_architecture("llama")
    want = "sharing refused: llama's decoder takes no position_ids, so the rejected completion cannot restart at the "
    assert (res.status, res.reason) == ("pass", want + "prompt end: turn share"), res
    monkeypatch.undo()
    _nth_call_raises(monkeypatch, 3, ValueError("bad mask"))
    res = check_architecture("llama")
    assert res.status == "fail" and res.reason.startswith("shared layout crashed: ValueError: bad mask; "), res


def test_without_shared_the_prompt_sharing_layout_is_not_checked():
    res = check_architecture("llama", shared=False)
    assert res.status == "pass" and "shared" not in res.errors and "fused" in res.errors, res


def test_the_sweeps_report_lines_and_table(capsys, monkeypatch):
    from prefzoo.testing.architectures import main

    assert main(["llama"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"llama {24}pass  \[.+; .+\] fused=\S+ chunked=\S+ token=\S+ entropy=\S+ chunked-entropy=\S+ "
                        r"shared=\S+ split=\S+ packed=\S+  \(\d+\.\ds\)", out[0]), out  # fmt: skip
    assert out[-1] == "counts: {'pass': 1}; prompt sharing refused (with its reason) for 0 of the passing ones"
    assert main(["llama", "--markdown"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["| model type | result | logit transform | layer types | max error (fused / shared) | notes |",
                       "|---|---|---|---|---|---|"]  # fmt: skip
    assert re.fullmatch(r"\| llama \| pass \| .+ \| .+ \| \de-\d\d / \de-\d\d \|  \|", out[2]), out
    from prefzoo.model.fast.prompt import SharedPromptError

    _nth_call_raises(monkeypatch, 3, SharedPromptError("shared prompt: refused here"))
    assert main(["llama"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "counts: {'pass': 1}; prompt sharing refused (with its reason) for 1 of the passing ones"


def test_a_fast_path_that_gives_other_log_probs_fails(monkeypatch):
    sound = logps.sequence_logps

    def off(*args, **kw):  # every fast path 1% off
        out = sound(*args, **kw)
        out["logps"] = out["logps"] * 1.01  # a CompletionLogps is a dict
        return out

    monkeypatch.setattr(prefzoo.model, "sequence_logps", off)  # the name the sweep calls
    res = check_architecture("llama")
    assert res.status == "fail" and res.reason.startswith("fast path differs from the model's logits; "), res


def test_a_fault_past_the_first_chunk_of_the_chunked_head_fails_the_architecture(monkeypatch):
    """The sweep cuts the tiny rows into head chunks of 5 positions, so that a fault at a chunk boundary shows: with
    the default chunk (1,024 positions) every tiny row is one chunk and this fault would pass unseen."""
    sound = logps._chunked_head_logps

    def off_past_the_first_chunk(head, h, targets, want_entropy, opts):
        lp, ent = sound(head, h, targets, want_entropy, opts)
        n = opts.chunk_size
        return torch.cat([lp[:n], lp[n:] + 0.01]), ent  # (M,) wrong after position chunk_size

    monkeypatch.setattr(logps, "_chunked_head_logps", off_past_the_first_chunk)
    res = check_architecture("llama", shared=False)
    assert res.status == "fail" and res.reason.startswith("fast path differs from the model's logits"), res
    assert res.errors["fused"] < 1e-4 and res.errors["chunked"] > 1e-3, res  # only the chunked path is off
