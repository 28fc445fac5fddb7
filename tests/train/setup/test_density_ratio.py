"""``prefzoo train --density-ratio``: BCO's density-ratio weights (UDM) in the trainer, against TRL's computation.

The end-to-end run trains ``bco`` on a tiny unpaired dataset through the CLI; a callback records every micro-batch
and the weights the loss receives.  An independent transcription of TRL's BCOTrainer (its example embedding_func:
mean-pooled last hidden states of each prompt alone; ``LogisticRegression(class_weight="balanced")`` fitted on every
training prompt; ``_get_udm_weight``) recomputes them from the starting model.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from prefzoo.cli.main import main
from prefzoo.train.callbacks import Callback
from tests.support.shaped_data import make_unpaired
from tests.support.tiny import write_jsonl

RECORDED: list[dict[str, Any]] = []


class Recorder(Callback):
    """Each micro-batch's collated rows and the density-ratio weights handed to the loss."""

    def on_batch(self, state: Any, fields: dict[str, Any]) -> None:
        b = state.batch
        prompts = [ids[(a.bool() & ~c)].tolist() for ids, a, c in
                   zip(b["input_ids"], b["attention_mask"], b["completion_mask"], strict=True)]  # fmt: skip
        RECORDED.append({"prompts": prompts, "labels": b["labels"].clone(),
                         "weights": fields["density_ratio_weights"].clone()})  # fmt: skip


def _run(capsys: Any, *args: str) -> tuple[int, str, str]:
    rc = main(["train", *args, "--report-to", "none", "--no-progress"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _trl_weights(lm: Any, prompts: list[list[int]], labels: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """TRL's BCOTrainer on these prompts: embed each alone, fit the balanced logistic regression on all, weight."""
    linear_model = pytest.importorskip("sklearn.linear_model")

    def embedding_func(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:  # TRL's BCO example
        with torch.no_grad():
            h = lm(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states[-1]
        m = attention_mask.unsqueeze(-1).float()
        return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)

    emb = torch.cat([embedding_func(torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long)) for p in prompts])
    clf = linear_model.LogisticRegression(class_weight="balanced", tol=1e-12, max_iter=10_000)
    clf.fit(emb.double().numpy(), labels.double().numpy())
    prob = torch.as_tensor(clf.predict_proba(emb.double().numpy())[:, 1])
    weight = (prob / (1 - prob + 1e-8)).clamp(min=lo, max=hi)  # _get_udm_weight
    return torch.where(labels, torch.ones_like(weight), weight)


@pytest.mark.parametrize(("lo", "hi"), [(0.5, 10.0), pytest.param(0.9, 1.1, marks=pytest.mark.slow)])
def test_trained_bco_gets_trls_density_ratio_weights(tmp_path, tiny_dir, capsys, lo, hi):
    """One epoch of 16 examples (sample ≥ data: the classifier sees every prompt, as the transcription does)."""
    from transformers import AutoModelForCausalLM

    RECORDED.clear()
    data = write_jsonl(tmp_path / "unpaired.jsonl", make_unpaired(16))
    rc, out, err = _run(capsys, "--loss", "bco", "--density-ratio", "--min-density-ratio", str(lo),
                   "--max-density-ratio", str(hi), "--model", str(tiny_dir), "--dataset", str(data),
                   "--max-steps", "4", "--per-device-batch-size", "4", "--grad-accum", "1", "--lr", "1e-3",
                   "--eval-fraction", "0", "--output-dir", str(tmp_path / "out"),
                   "--callback", f"{__name__}:Recorder")  # fmt: skip
    assert rc == 0, err
    assert "density-ratio classifier fitted on 8 desirable and 8 undesirable prompts" in out
    prompts = [p for r in RECORDED for p in r["prompts"]]
    labels = torch.cat([r["labels"] for r in RECORDED])
    got = torch.cat([r["weights"] for r in RECORDED]).double()
    assert len(prompts) == 16 and len({tuple(p) for p in prompts}) == 16  # one epoch, every example once
    lm = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()  # the reference: the frozen starting model
    want = _trl_weights(lm, prompts, labels, lo, hi)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert bool((got[labels] == 1).all()) and len(set(got[~labels].tolist())) > 1  # undesirable weights differ
    history = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    logged = [h["loss/bco/density_ratio_weight"] for h in history if "loss/bco/density_ratio_weight" in h]
    assert logged == pytest.approx([float(r["weights"].mean()) for r in RECORDED], abs=1e-6)  # the loss used them


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--loss", "bco", "--density-ratio", "--min-density-ratio", "-1"], "min_density_ratio=-1.0"),
        (
            ["--loss", "bco", "--density-ratio", "--min-density-ratio", "2", "--max-density-ratio", "1"],
            "0 <= min <= max",
        ),
        (["--loss", "bco", "--density-ratio", "--max-density-ratio", "nan"], "need finite"),
        (["--loss", "bco", "--density-ratio", "--density-ratio-prompts", "0"], "density_ratio_prompts=0 must be >= 1"),
        (["--loss", "kto", "--density-ratio"], "loss 'kto' does not take density-ratio weights"),
        (["--loss", "bco", "--max-density-ratio", "5"], "--max-density-ratio set without --density-ratio"),
        (["--loss", "bco", "--density-ratio", "--precompute-ref"], "--density-ratio with --precompute-ref"),
    ],
)
def test_bad_density_ratio_settings_fail_in_one_line_before_any_model_loads(tmp_path, capsys, args, words):
    data = write_jsonl(tmp_path / "u.jsonl", make_unpaired(4))
    rc, _, err = _run(capsys, *args, "--model", str(tmp_path / "no-such-model"), "--dataset", str(data))
    assert rc == 2 and words in err and err.count("\n") == 1 and "no-such-model" not in err, err


def test_density_ratio_is_off_by_default_as_in_trl():
    from prefzoo.train.config import TrainConfig

    cfg = TrainConfig()
    assert (cfg.density_ratio, cfg.density_ratio_prompts, cfg.min_density_ratio, cfg.max_density_ratio) == (
        False, 1024, 0.5, 10.0)  # fmt: skip
    assert TrainConfig.from_dict({"prompt_sample_size": 64}).density_ratio_prompts == 64  # TRL's name accepted


@pytest.mark.slow
def test_two_processes_train_as_one_with_density_ratio_weights(tmp_path, tiny_dir):
    """torchrun, 2 gloo ranks × 2 examples = 1 process × 4: the fit (gathered sample) and each rank's weights."""
    from tests.train.helpers import base_config, max_param_diff, params_of, run_inprocess, run_processes

    data = write_jsonl(tmp_path / "u.jsonl", make_unpaired(16))
    kw = dict(loss="bco", density_ratio=True, max_steps=2)
    two = run_processes(base_config(tiny_dir, data, tmp_path / "two", per_device_batch_size=2, **kw), 2)
    one = run_inprocess(base_config(tiny_dir, data, tmp_path / "one", per_device_batch_size=4, **kw))
    assert max_param_diff(two["params"], params_of(one.model)) < 1e-6
    got = [h["loss/bco/density_ratio_weight"] for h in two["history"] if "loss/bco/density_ratio_weight" in h]
    want = [h["loss/bco/density_ratio_weight"] for h in one.history if "loss/bco/density_ratio_weight" in h]
    assert got == pytest.approx(want, abs=1e-6) and len(got) == 2


def _examples(tokenizer: Any, n: int) -> list[dict[str, Any]]:
    """``n`` tokenised unpaired examples (prompts of different lengths, so batches are padded)."""
    rows = make_unpaired(n)
    return [{"id": f"train:{i}", "prompt_ids": tokenizer(r["prompt"] + "?" * (i % 5))["input_ids"],
             "completion_ids": tokenizer(r["completion"])["input_ids"], "label": r["label"]}
            for i, r in enumerate(rows)]  # fmt: skip


def test_each_undesirable_prompt_is_embedded_once_and_weighted_as_per_batch(tiny_dir):
    """Three epochs of shuffled batches and an evaluation pass: every undesirable example's prompt is embedded once,
    no desirable one ever, and every weight equals the per-batch computation (the whole batch embedded, padded)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prefzoo.data.groups import UnpairedCollator
    from prefzoo.losses.density_ratio import DensityRatioClassifier, udm_weights
    from prefzoo.model.embedding import mean_pooled_hidden_states
    from prefzoo.train.setup.density_ratio import DensityRatioWeights, prompt_rows

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    embed = mean_pooled_hidden_states(AutoModelForCausalLM.from_pretrained(tiny_dir).eval())
    embedded: list[tuple[int, ...]] = []

    def counted(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        embedded.extend(tuple(r[m.bool()].tolist()) for r, m in zip(input_ids, attention_mask, strict=True))
        return embed(input_ids, attention_mask)

    g = torch.Generator().manual_seed(0)
    d = embed(torch.tensor([[5, 6]]), torch.ones(1, 2, dtype=torch.long)).shape[1]
    clf = DensityRatioClassifier(torch.randn(d, generator=g, dtype=torch.float64) * 3, torch.tensor(0.1).double())
    weights = DensityRatioWeights(counted, clf, 0.5, 10.0)
    train, held_out = _examples(tok, 12), [{**ex, "id": f"eval:{i}"} for i, ex in enumerate(_examples(tok, 4))]
    collate = UnpairedCollator(tok.pad_token_id)
    perms = [torch.randperm(12, generator=g) for _ in range(3)]  # three epochs
    batches = [collate([train[int(i)] for i in perm[k : k + 4]]) for perm in perms for k in range(0, 12, 4)]
    batches.append(collate(held_out))
    for batch in batches:
        got = weights(batch)
        with torch.no_grad():
            prob = clf.prob_desirable(embed(*prompt_rows(batch)))  # the per-batch computation (before the cache)
        want = udm_weights(prob, batch["labels"], 0.5, 10.0).float()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert bool((got[batch["labels"]] == 1).all())
    undesirable = [tuple(ex["prompt_ids"]) for ex in train + held_out if not ex["label"]]  # eval's: ids of their own
    assert sorted(embedded) == sorted(undesirable) and len(embedded) == 8  # once each, desirable never
    assert len({round(float(w), 4) for b in batches for w in weights(b)[~b["labels"]]}) > 2  # weights differ


def _bco(tiny_dir: Any, data: Any, out: Any, **kw: Any) -> dict[str, Any]:
    from tests.train.helpers import base_config

    # 16 examples, 4 per step: 4 steps an epoch, 2 epochs (the weights of epoch 2 come from the per-id cache)
    return base_config(tiny_dir, data, out, loss="bco", density_ratio=True, max_steps=8, save_steps=2, **kw)


@pytest.fixture(scope="module")
def bco_runs(tmp_path_factory, tiny_dir):
    """An uninterrupted `bco --density-ratio` run, and one stopped after 6 steps (mid epoch 2) with its checkpoints."""
    from tests.train.helpers import params_of, run_inprocess

    root = tmp_path_factory.mktemp("bco-resume")
    data = write_jsonl(root / "u.jsonl", make_unpaired(16))
    full = run_inprocess(_bco(tiny_dir, data, root / "full"))
    first = run_inprocess({**_bco(tiny_dir, data, root / "run"), "stop_after_steps": 6})
    assert full.global_step == 8 and first.global_step == 6 and first.final_dir is None
    return {"data": data, "root": root, "full": params_of(full.model), "full_history": full.history}


def test_a_resumed_density_ratio_run_loads_its_classifier_and_trains_bit_identically(
    bco_runs, tiny_dir, monkeypatch, capsys
):
    import shutil

    from prefzoo.losses.density_ratio import DensityRatioClassifier
    from prefzoo.train.setup.density_ratio import CLASSIFIER_FILE
    from tests.train.helpers import params_of, run_inprocess

    out = bco_runs["root"] / "resumed"
    shutil.copytree(bco_runs["root"] / "run", out)  # the stopped run's folder, so the checkpoints stay for later tests
    assert (out / "checkpoints" / "step-00000006" / CLASSIFIER_FILE).is_file()

    def no_refit(*a: Any, **k: Any) -> Any:
        raise AssertionError("a resumed run refitted the density-ratio classifier")

    monkeypatch.setattr(DensityRatioClassifier, "fit", no_refit)
    capsys.readouterr()
    res = run_inprocess({**_bco(tiny_dir, bco_runs["data"], out), "resume": "auto"})
    assert res.global_step == 8
    assert "density-ratio classifier loaded from" in capsys.readouterr().out
    full, resumed = bco_runs["full"], params_of(res.model)
    assert all(torch.equal(full[k], resumed[k]) for k in full)  # bit-identical
    logged = [h["loss/bco/density_ratio_weight"] for h in res.history]
    assert logged == [h["loss/bco/density_ratio_weight"] for h in bco_runs["full_history"][6:]]


def _tamper(path: Any) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta, state = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    state["bias"] = state["bias"] + 1.0
    save_file(state, str(path), metadata=meta)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"density_ratio": False}, "trained with --density-ratio (it holds density_ratio.safetensors); add"),
        ({"max_density_ratio": 5.0}, "fitted with max_density_ratio=10.0 (this run 5.0); resume with"),
        ({"density_ratio_prompts": 8}, "density_ratio_prompts=1024 (this run 8)"),
        ("tampered", "failed its checksum"),
        ("garbled", "density_ratio.safetensors is unreadable"),
    ],
)
def test_a_checkpoint_and_a_run_that_disagree_on_the_classifier_is_a_one_line_error(bco_runs, tiny_dir, change, words):
    import shutil

    from prefzoo.train.checkpoint.save import ResumeError
    from prefzoo.train.setup.density_ratio import CLASSIFIER_FILE
    from tests.faults._run import reseal
    from tests.train.helpers import run_inprocess

    out = bco_runs["root"] / f"disagree-{abs(hash(str(change)))}"
    shutil.copytree(bco_runs["root"] / "run", out)
    path = out / "checkpoints" / "step-00000006" / CLASSIFIER_FILE
    cfg = {**_bco(tiny_dir, bco_runs["data"], out), "resume": "auto"}
    if change == "tampered":
        _tamper(path)
    elif change == "garbled":  # the same size, so the checkpoint's manifest still lists it as complete
        raw = path.read_bytes()
        path.write_bytes(b"\xff" * 16 + raw[16:])
    else:
        cfg.update(change)
    if change in ("tampered", "garbled"):
        reseal(path.parent)  # the marker fixed too, so the classifier's own checks are what refuses it
    with pytest.raises(ResumeError) as err:
        run_inprocess(cfg)
    assert words in str(err.value) and "\n" not in str(err.value), err.value


def test_resuming_a_run_without_density_ratio_with_it_is_a_one_line_error(bco_runs, tiny_dir):
    from prefzoo.train.checkpoint.save import ResumeError
    from tests.train.helpers import run_inprocess

    out = bco_runs["root"] / "plain"
    run_inprocess({**_bco(tiny_dir, bco_runs["data"], out), "density_ratio": False, "max_steps": 2})
    with pytest.raises(ResumeError, match=r"holds no density-ratio classifier \(density_ratio.safetensors\): it was "
                                          "trained without --density-ratio; resume without"):  # fmt: skip
        run_inprocess({**_bco(tiny_dir, bco_runs["data"], out), "resume": "auto", "max_steps": 4})
