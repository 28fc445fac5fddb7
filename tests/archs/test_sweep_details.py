"""The architecture sweep's details that a complete mutation run of prefzoo/testing/architectures.py found unpinned:
how a tiny model is built (seeded, eager, float32, weights of a visible size, the size limit), which token ids the
pairs use, the tolerance the sweep compares at, the reasons it reports, and the report ``main`` prints."""

from __future__ import annotations

import types

import pytest
import torch

import prefzoo.model
import prefzoo.model.logps as logps
import prefzoo.testing.architectures as arch
from prefzoo.testing.architectures import ArchResult, build_tiny, check_architecture
from tests.archs.test_sweep_faults import _nth_call_raises


def test_the_sweep_covers_every_causal_lm_type_in_order():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    got = arch.causal_lm_types()
    assert got == sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) and "llama" in got and len(got) > 100


@pytest.mark.parametrize(
    ("layer_types", "n", "want"),
    [
        (["full", "full", "sliding"], 2, ["full", "sliding"]),
        (["sliding", "full"], 3, ["sliding", "full", "sliding"]),  # the rest repeat the first type
        (["full"], 2, ["full", "full"]),  # one type only: kept
        (["full", "full"], 2, ["full", "full"]),
    ],
)
def test_mixed_layer_types_keep_the_first_type_and_the_first_other(layer_types, n, want):
    assert arch._mixed_layer_types(layer_types, n) == want


def test_a_config_without_grouped_query_attention_keeps_plain_multi_head_attention():
    """Nemotron's config leaves ``num_key_value_heads`` unset (one key/value head per query head): the tiny config
    does not impose the two key/value heads that configs with GQA get."""
    cfg = arch.tiny_config("nemotron")
    assert cfg.num_key_value_heads is None and cfg.num_attention_heads == 4


def test_a_tiny_model_is_seeded_eager_float32_with_weights_of_a_visible_size():
    default = build_tiny("llama")
    same, other = build_tiny("llama", seed=0), build_tiny("llama", seed=1)
    w = {k: v for k, v in default.state_dict().items()}
    assert all(torch.equal(v, same.state_dict()[k]) for k, v in w.items())
    assert not torch.equal(w["model.embed_tokens.weight"], other.state_dict()["model.embed_tokens.weight"])
    assert default.config._attn_implementation == "eager" and not default.training
    for name, p in default.named_parameters():
        if p.dim() >= 2:  # every matrix drawn from N(0, 0.3²), the embedding and the head included
            assert 0.25 < float(p.detach().std()) < 0.35, (name, float(p.std()))
        else:  # norms keep their initialisation
            assert torch.equal(p, torch.ones_like(p)), name
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        dtypes = {p.dtype for p in build_tiny("llama").parameters()}
    finally:
        torch.set_default_dtype(old)
    assert dtypes == {torch.float32}


def test_the_size_limit_admits_a_model_of_exactly_that_size(monkeypatch):
    n = sum(p.numel() for p in build_tiny("llama").parameters())
    monkeypatch.setattr(arch, "MAX_PARAMS", n)
    assert sum(p.numel() for p in build_tiny("llama").parameters()) == n
    monkeypatch.setattr(arch, "MAX_PARAMS", n - 1)
    with pytest.raises(arch.TinyBuildError):
        build_tiny("llama")


def test_pair_ids_start_right_after_the_three_special_tokens():
    pair = arch.tiny_pairs(5, shapes=((30, 30, 30),))[0]
    ids = {t for k in ("prompt_ids", "chosen_ids", "rejected_ids") for t in pair[k]}
    assert ids == {3, 4}


def test_a_head_without_out_features_leaves_the_whole_vocabulary():
    """(It raised TypeError before: ``min(VOCAB, *())`` with nothing to compare.)"""
    model = types.SimpleNamespace(get_output_embeddings=lambda: torch.nn.Identity(), config=types.SimpleNamespace())
    assert arch._token_range(model) == arch.VOCAB


def test_a_passing_result_names_its_type_transform_and_layer_types():
    res = check_architecture("gemma2", shared=False)
    assert (res.model_type, res.status, res.transform, res.layer_types) == (
        "gemma2",
        "pass",
        "soft-cap 5",
        "full_attention,sliding_attention",
    ), res


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ImportError("e" * 150), "needs a package: " + "e" * 100),
        (ValueError("v" * 150), "cannot be built tiny (ValueError: " + "v" * 90 + ")"),
    ],
)
def test_a_long_build_error_is_cut(monkeypatch, error, reason):
    def fails(model_type):
        raise error

    monkeypatch.setattr(arch, "build_tiny", fails)
    assert check_architecture("llama").reason == reason


def _shifted_from(monkeypatch, first: int, delta: float) -> None:
    """sequence_logps' log-probs from its ``first``-th call on (1 fused, 2 chunked, 3 the shared layout) + ``delta``."""
    sound, calls = logps.sequence_logps, []

    def counted(*args, **kw):
        calls.append(1)
        out = sound(*args, **kw)
        if len(calls) >= first:
            out["logps"] = out["logps"] + delta
        return out

    monkeypatch.setattr(prefzoo.model, "sequence_logps", counted)  # the name the sweep calls


@pytest.mark.parametrize(
    ("first", "delta", "status", "reason"),
    [
        (1, 5e-4, "pass", ""),  # within the tolerance, 10 × TOKEN_TOL = 1e-3 nats per sequence
        (1, 1.05e-3, "fail", "fast path differs from the model's logits"),
        (3, 5e-4, "pass", ""),
        (3, 1.05e-3, "fail", "shared-prompt layout differs from the plain rows"),
    ],
)
def test_the_sweep_compares_at_ten_times_the_token_tolerance(monkeypatch, first, delta, status, reason):
    _shifted_from(monkeypatch, first, delta)
    res = check_architecture("llama")
    assert (res.status, res.reason.split(";")[0]) == (status, reason), res


def test_a_refusal_reason_is_the_text_after_its_first_colon_or_the_whole_text():
    from prefzoo.model.fast.prompt import SharedPromptError

    for message, reason in [("shared prompt: refused here", "refused here"), ("no colon here", "no colon here")]:
        with pytest.MonkeyPatch.context() as mp:
            _nth_call_raises(mp, 3, SharedPromptError(message))
            res = check_architecture("llama")
        assert (res.status, res.reason) == ("pass", "sharing refused: " + reason), res


def test_long_crash_messages_are_cut(monkeypatch):
    _nth_call_raises(monkeypatch, 1, RuntimeError("r" * 150))
    assert check_architecture("llama").reason.startswith("fast path cannot run: RuntimeError: " + "r" * 100 + "; ")
    monkeypatch.undo()
    _nth_call_raises(monkeypatch, 3, ValueError("s" * 150))
    assert check_architecture("llama").reason.startswith("shared layout crashed: ValueError: " + "s" * 80 + "; ")


def test_a_crash_of_the_split_attention_fails_with_its_type_and_message(monkeypatch):
    sound = arch._compare_shared

    def crashes_on_split(model, res, ref_sum, batch, key, what, packing=False):
        if key == "split":
            raise RuntimeError("boom " * 30)
        return sound(model, res, ref_sum, batch, key, what, packing)

    monkeypatch.setattr(arch, "_compare_shared", crashes_on_split)
    res = check_architecture("llama")
    assert res.status == "fail", res
    assert res.reason == f"split shared-prompt attention crashed: RuntimeError: {('boom ' * 30)[:80]}; " + (
        "THE SELF-CHECK MISSES IT"  # only the sweep's comparison crashed: the self-check runs the real split
    ), res


def test_the_report_counts_each_status_and_times_each_type(monkeypatch, capsys):
    results = {
        "a": ArchResult("a", "pass", errors={"fused": 1e-6, "shared": 2e-6}, transform="t", layer_types="full"),
        "b": ArchResult("b", "pass", reason="sharing refused: why", errors={"fused": 3e-6}, transform="t"),
        "c": ArchResult("c", "skip", reason="cannot be built tiny"),
    }
    monkeypatch.setattr(arch, "check_architecture", lambda t: results[t])
    clock = iter([100.0, 101.5, 200.0, 200.25, 300.0, 300.0])
    monkeypatch.setattr("time.perf_counter", lambda: next(clock))
    assert arch.main(["a", "b", "c"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{'a':28s} pass  [t; full] fused=1.0e-06 shared=2.0e-06  (1.5s)",
        f"{'b':28s} pass  [t; ] fused=3.0e-06 sharing refused: why (0.2s)",
        f"{'c':28s} skip  [; ]  cannot be built tiny (0.0s)",
        "",
        "counts: {'pass': 2, 'skip': 1}; prompt sharing refused (with its reason) for 1 of the passing ones",
    ]
    clock = iter([0.0] * 4)
    assert arch.main(["--markdown", "a", "c"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "| model type | result | logit transform | layer types | max error (fused / shared) | notes |",
        "|---|---|---|---|---|---|",
        "| a | pass | t | full | 1e-06 / 2e-06 |  |",
        "| c | skip |  |  |  | cannot be built tiny |",
        "",
        "counts: {'pass': 1, 'skip': 1}; prompt sharing refused (with its reason) for 0 of the passing ones",
    ]
