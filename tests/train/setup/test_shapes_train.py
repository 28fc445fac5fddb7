"""The trainer on lists and unpaired data: the loss's declared shapes decide the batches; mismatches are one line.

The end-to-end runs train a tiny Llama from local jsonl files through ``prefzoo train`` (the CLI, in-process).
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from prefzoo.cli.main import main
from prefzoo.registry import get_loss, list_losses
from prefzoo.spec import Loss
from prefzoo.train.setup.shape_plan import ShapeError, plan_shape
from prefzoo.types import Need, Shape
from tests.support.shaped_data import make_lists, make_ultrafeedback_raw, make_unpaired
from tests.support.tiny import make_pairs, write_jsonl


def _with_shapes(name: str, shapes: set[Shape], needs: frozenset[Need] | None = None) -> Loss:
    """A registered loss re-declared with other shapes: the plan reads only the declaration."""
    loss = get_loss(name)
    spec = dataclasses.replace(loss.spec, shapes=frozenset(shapes), needs=needs or loss.spec.needs)
    return Loss(spec, loss.params)


PAIRWISE = _with_shapes("dpo", {Shape.PAIR})
LISTWISE = _with_shapes("dpo", {Shape.LIST})
UNPAIRED = _with_shapes("dpo", {Shape.UNPAIRED}, frozenset({Need.REFERENCE, Need.KL_REFERENCE}))


def test_plan_reads_the_declared_shapes():
    assert plan_shape(PAIRWISE, "pairs").batches == "pairs"
    assert plan_shape(LISTWISE, "lists").batches == "lists"
    assert plan_shape(LISTWISE, "pairs").batches == "pairs"  # a list loss on pairs: K = 2 groups
    plan = plan_shape(PAIRWISE, "lists", pairs_from_lists="all-pairs")
    assert (plan.batches, plan.pairs_from_lists) == ("pairs", "all-pairs")
    plan = plan_shape(UNPAIRED, "pairs", unpair=True)
    assert (plan.batches, plan.unpair, plan.kl) == ("unpaired", True, True)
    assert plan_shape(UNPAIRED, "unpaired").kl


@pytest.mark.parametrize(
    ("loss", "data", "kw", "words"),
    [
        (PAIRWISE, "lists", {}, ["'dpo' takes pairs", "holds lists", "--pairs-from-lists best-worst | all-pairs"]),
        (UNPAIRED, "pairs", {}, ["takes unpaired examples", "holds pairs", "--unpair"]),
        (PAIRWISE, "unpaired", {}, ["takes pairs", "unpaired examples", "no flag"]),
        (LISTWISE, "unpaired", {}, ["takes lists", "unpaired examples"]),
        (UNPAIRED, "lists", {}, ["takes unpaired examples", "holds lists", "no flag"]),
        (LISTWISE, "lists", {"pairs_from_lists": "best-worst"}, ["drop --pairs-from-lists"]),
        (PAIRWISE, "pairs", {"unpair": True}, ["drop --unpair"]),
    ],
)
def test_mismatches_name_loss_data_and_flag(loss, data, kw, words):
    with pytest.raises(ShapeError) as e:
        plan_shape(loss, data, **kw)
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["train", *args, "--report-to", "none", "--no-progress"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_mismatch_fails_before_any_model_loads(tmp_path, capsys):
    lists = write_jsonl(tmp_path / "ultrafeedback_raw.jsonl", make_ultrafeedback_raw(4))
    unpaired = write_jsonl(tmp_path / "unpaired.jsonl", make_unpaired(4))
    nope = str(tmp_path / "no-such-model")  # never opened: the error comes first
    rc, _, err = _run(capsys, "--loss", "dpo", "--model", nope, "--dataset", str(lists))
    assert rc == 2 and err.count("\n") == 1 and "--pairs-from-lists" in err and "no-such-model" not in err
    rc, _, err = _run(capsys, "--loss", "dpo", "--model", nope, "--dataset", str(unpaired))
    assert rc == 2 and err.count("\n") == 1 and "unpaired examples" in err


def test_precompute_ref_with_kl_rows_is_refused_before_any_model_loads(tmp_path, capsys):
    _needs("kto")
    unpaired = write_jsonl(tmp_path / "u.jsonl", make_unpaired(4))
    rc, _, err = _run(capsys, "--loss", "kto", "--precompute-ref", "--model", str(tmp_path / "nope"),
                      "--dataset", str(unpaired))  # fmt: skip
    assert rc == 2 and "--precompute-ref with loss 'kto'" in err and "KL rows" in err and err.count("\n") == 1


@pytest.mark.parametrize(("loss", "make"), [("mmpo-list", make_lists), ("bco", make_unpaired)])
def test_precompute_ref_on_lists_and_unpaired_equals_the_live_reference(tmp_path, tiny_dir, loss, make):
    """Reference log-probs of every list completion / unpaired example computed once, cached and looked up by row:
    the same training as the reference running alongside (weights within float32 rounding), and a cache hit next."""
    from prefzoo.scoring import PrecomputedReference
    from prefzoo.train.callbacks import Callback
    from tests.train.helpers import base_config, max_param_diff, params_of, run_inprocess

    _needs(loss)
    data = write_jsonl(tmp_path / "d.jsonl", make(12))
    kw = dict(loss=loss, max_steps=3, lr=5e-3)
    live = run_inprocess(base_config(tiny_dir, data, tmp_path / "live", **kw))
    cache = tmp_path / "cache"
    seen = []

    class Probe(Callback):  # records the reference the run trained with
        def on_train_begin(self, state):
            seen.append(state.reference)

    cached = run_inprocess(base_config(tiny_dir, data, tmp_path / "pre", precompute_ref=True,
                                       ref_cache_dir=str(cache), **kw), callbacks=[Probe()])  # fmt: skip
    assert isinstance(seen[0], PrecomputedReference) and len(list(cache.iterdir())) == 1
    keys = next(iter(seen[0].table))
    assert ("#" in keys) == (loss == "mmpo-list")  # lists: one row per completion, <id>#<k>
    assert max_param_diff(params_of(live.model), params_of(cached.model)) < 1e-5
    assert max_param_diff(params_of(live.model), params_of(run_inprocess(
        base_config(tiny_dir, data, tmp_path / "zero", **{**kw, "max_steps": 1})).model)) > 1e-4  # it can fail


def _needs(name: str) -> None:
    if name not in list_losses():
        pytest.skip(f"loss {name!r} is not registered on this branch")


def test_group_fields_place_each_completion_in_its_slot(tiny_dir):
    """One forward over all G·K rows, then the (G, K) grid: each slot holds its own completion's log-prob."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prefzoo.data.formats import normalize
    from prefzoo.data.groups import GroupCollator, tokenize_lists
    from prefzoo.model.logps import PolicyLogps, sequence_logps
    from prefzoo.scoring import FrozenReference, batch_fields, batch_type

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    lm = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    rows = make_lists(3, k=4)
    rows[1]["completions"], rows[1]["scores"] = rows[1]["completions"][:2], rows[1]["scores"][:2]  # a short group
    ds, _ = tokenize_lists(normalize(datasets.Dataset.from_list(rows)), tok, 16, 8)
    batch = GroupCollator(tok.pad_token_id)([ds[i] for i in range(3)])
    loss = get_loss("dpo")  # needs a reference: the reference grid is checked too
    fields = batch_fields(loss, PolicyLogps(lm), FrozenReference(lm, 1024), batch, contextlib.nullcontext)
    assert batch_type(batch).__name__ == "GroupBatch"
    assert fields["mask"].tolist() == [[True] * 4, [True, True, False, False], [True] * 4]
    for g in range(3):
        for k, comp in enumerate(ds[g]["completion_ids"]):
            ids = torch.tensor([ds[g]["prompt_ids"] + comp])
            cm = torch.zeros_like(ids, dtype=torch.bool)
            cm[0, len(ds[g]["prompt_ids"]) :] = True
            want = sequence_logps(lm, ids, torch.ones_like(ids), cm).logps[0]
            assert torch.allclose(fields["policy_logps"][g, k], want, atol=1e-5), (g, k)
            assert torch.allclose(fields["ref_logps"][g, k], want, atol=1e-5), (g, k)
            assert int(fields["lengths"][g, k]) == len(comp)
    assert fields["policy_logps"][1, 2:].eq(0).all() and fields["scores"][0].tolist() == sorted(rows[0]["scores"])[::-1]


def test_unpaired_fields_score_the_mismatched_kl_pairs(tiny_dir):
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prefzoo.data.formats import normalize
    from prefzoo.data.groups import UnpairedCollator, tokenize_unpaired
    from prefzoo.model.logps import PolicyLogps, sequence_logps
    from prefzoo.scoring import FrozenReference, batch_fields

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    lm = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    ds, _ = tokenize_unpaired(normalize(datasets.Dataset.from_list(make_unpaired(4))), tok, 16, 8)
    batch = UnpairedCollator(tok.pad_token_id, kl=True)([ds[i] for i in range(4)])
    fields = batch_fields(UNPAIRED, PolicyLogps(lm), FrozenReference(lm, 1024), batch,
                          contextlib.nullcontext)  # fmt: skip
    assert not fields["kl_policy_logps"].requires_grad and fields["policy_logps"].requires_grad
    for i in range(4):
        prev = (i - 1) % 4  # TRL: example i's KL completion is example i-1's
        ids = torch.tensor([ds[i]["prompt_ids"] + ds[prev]["completion_ids"]])
        cm = torch.zeros_like(ids, dtype=torch.bool)
        cm[0, len(ds[i]["prompt_ids"]) :] = True
        want = sequence_logps(lm, ids, torch.ones_like(ids), cm).logps[0]
        assert torch.allclose(fields["kl_policy_logps"][i], want, atol=1e-5)
        assert torch.allclose(fields["kl_ref_logps"][i], want, atol=1e-5)
    assert fields["labels"].tolist() == [True, False, True, False]


# -- end to end: prefzoo train on a tiny model from local files ------------------------------------------------------


def _train_args(tmp_path, tiny_dir, data, *extra: str) -> list[str]:
    return ["--model", str(tiny_dir), "--dataset", str(data), "--max-steps", "2", "--per-device-batch-size", "4",
            "--grad-accum", "1", "--lr", "1e-3", "--eval-fraction", "0", "--output-dir", str(tmp_path / "out"),
            *extra]  # fmt: skip


def _history(tmp_path) -> list[dict]:
    import json

    return [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_train_mmpo_list_on_raw_ultrafeedback(tmp_path, tiny_dir, capsys):
    _needs("mmpo-list")
    data = write_jsonl(tmp_path / "ultrafeedback_raw.jsonl", make_ultrafeedback_raw(24))
    args = [*_train_args(tmp_path, tiny_dir, data), "--eval-fraction", "0.25", "--eval-at-start"]
    rc, out, err = _run(capsys, "--loss", "mmpo-list", *args)
    assert rc == 0, err
    assert "data shape lists, trained as lists" in out and "train: 18 lists kept" in out
    steps = [r for r in _history(tmp_path) if "loss" in r]
    assert len(steps) == 2 and all("rewards/ranking_accuracy" in r and "logps/mean" in r for r in steps)
    evals = [r for r in _history(tmp_path) if "eval/reward_accuracy" in r]
    assert len(evals) == 2 and all(r["eval/pairs"] == 6 for r in evals)  # the 6 held-out lists, before and after


@pytest.mark.slow
def test_train_dpo_with_pairs_from_lists(tmp_path, tiny_dir, capsys):
    data = write_jsonl(tmp_path / "ultrafeedback_raw.jsonl", make_ultrafeedback_raw(16))
    rc, out, err = _run(capsys, "--loss", "dpo", "--pairs-from-lists", "best-worst",
                        *_train_args(tmp_path, tiny_dir, data))  # fmt: skip
    assert rc == 0, err
    assert "trained as pairs (--pairs-from-lists best-worst)" in out
    assert "train: 16 pairs kept" in out  # one pair per list
    assert [r["step"] for r in _history(tmp_path) if "loss" in r] == [1, 2]


@pytest.mark.slow
def test_train_kto_on_unpaired_examples(tmp_path, tiny_dir, capsys):
    _needs("kto")
    data = write_jsonl(tmp_path / "unpaired.jsonl", make_unpaired(24))
    rc, out, err = _run(capsys, "--loss", "kto", *_train_args(tmp_path, tiny_dir, data), "--eval-fraction", "0.25")
    assert rc == 0, err
    assert "KL pairs: completions rotated by one" in out
    assert [r["eval/pairs"] for r in _history(tmp_path) if "eval/pairs" in r] == [6.0]
    steps = [r for r in _history(tmp_path) if "loss" in r]
    assert len(steps) == 2 and all(0.0 <= r["data/desirable"] <= 1.0 for r in steps)


@pytest.mark.slow
def test_train_kto_on_pairs_with_unpair(tmp_path, tiny_dir, capsys):
    _needs("kto")
    data = write_jsonl(tmp_path / "pairs.jsonl", make_pairs(8))
    rc, _, err = _run(capsys, "--loss", "kto", *_train_args(tmp_path, tiny_dir, data))
    assert rc == 2 and "--unpair" in err
    rc, out, err = _run(capsys, "--loss", "kto", "--unpair", *_train_args(tmp_path, tiny_dir, data))
    assert rc == 0, err
    assert "trained as unpaired (--unpair" in out and "train: 16 examples kept" in out  # 8 pairs -> 16 examples


def test_group_and_unpaired_metrics():
    from prefzoo.train.loop.metrics import step_metrics
    from prefzoo.types import GroupBatch, LossOutput, UnpairedBatch

    group = GroupBatch(policy_logps=torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -2.0, 0.0]]),
                       scores=torch.tensor([[2.0, 2.0, 0.0], [1.0, 0.0, 0.0]]),
                       mask=torch.tensor([[True, True, True], [True, True, False]]))  # fmt: skip
    rewards = torch.tensor([[0.1, 0.5, 0.0], [0.0, 0.3, 9.0]])  # group 0: a tied best on top; group 1: the worst
    out = LossOutput(torch.zeros(2), torch.tensor([0.5, 0.0]), torch.tensor([0.0, 0.3]), rewards=rewards)
    m = step_metrics(group, out, torch.tensor(0.0))
    assert m["rewards/ranking_accuracy"] == 0.5  # the padded slot's 9.0 is ignored
    assert m["rewards/accuracies"] == 0.5 and m["logps/mean"] == pytest.approx(-9.0 / 5)
    un = UnpairedBatch(policy_logps=torch.tensor([-1.0, -3.0, -2.0]), labels=torch.tensor([True, False, False]))
    out = LossOutput(torch.zeros(3), torch.tensor([1.0, 1.0, 1.0]), torch.zeros(3))
    m = step_metrics(un, out, torch.tensor(0.0))
    assert m["rewards/accuracies"] == pytest.approx(1 / 3)  # reward > point agrees with the label only for 0
    assert m["logps/desirable"] == -1.0 and m["logps/undesirable"] == -2.5
    assert m["data/desirable"] == pytest.approx(1 / 3)


@pytest.mark.slow
def test_train_bco_keeps_its_state_in_checkpoints(tmp_path, tiny_dir, capsys):
    """A stateful unpaired loss: its running mean δ is saved in every checkpoint (safetensors) and advances every
    step."""
    _needs("bco")
    data = write_jsonl(tmp_path / "unpaired.jsonl", make_unpaired(16))
    rc, _, err = _run(capsys, "--loss", "bco", "--save-steps", "1", *_train_args(tmp_path, tiny_dir, data))
    assert rc == 0, err
    from safetensors.torch import load_file

    saved = sorted((tmp_path / "out" / "checkpoints").glob("step-*/loss_state.safetensors"))
    assert len(saved) == 2
    assert not list((tmp_path / "out" / "checkpoints").glob("step-*/custom_checkpoint_*"))  # nothing pickled
    states = [load_file(str(f)) for f in saved]
    assert float(states[0]["count"]) < float(states[1]["count"])  # δ advanced between the two steps


@pytest.mark.slow
def test_train_list_loss_on_pairs_as_k2_groups(tmp_path, tiny_dir, capsys):
    """A list loss on pair data trains on K = 2 groups: mmpo-list on pairs equals mmpo (lists' K = 2 identity)."""
    _needs("mmpo-list")
    data = write_jsonl(tmp_path / "pairs.jsonl", make_pairs(8))
    losses = {}
    for name in ("mmpo-list", "mmpo"):
        rc, _, err = _run(capsys, "--loss", name, *_train_args(tmp_path / name, tiny_dir, data))
        assert rc == 0, err
        losses[name] = [r["loss"] for r in _history(tmp_path / name) if "loss" in r]
    assert losses["mmpo-list"] == pytest.approx(losses["mmpo"], abs=1e-5)
