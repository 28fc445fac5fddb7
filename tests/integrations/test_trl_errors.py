"""What the adapter refuses, in one line, before TRL loads anything; and the supported TRL range."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

import pytest

import prefzoo
from prefzoo.spec import LossParamError
from prefzoo.types import Shape
from tests.integrations.trl_support import config

ROOT = Path(__file__).resolve().parents[2]


def _construct(tmp_path, loss, loss_params=None, **cfg):
    """The adapter on a model path that does not exist: an error about the loss must come before loading."""
    import datasets

    from prefzoo.integrations.trl import DPOTrainer

    ds = datasets.Dataset.from_list([{"prompt": "a", "chosen": "b", "rejected": "c"}])
    args = config(tmp_path, **cfg)
    return DPOTrainer(str(tmp_path / "no-model"), None, args, train_dataset=ds, loss=loss, loss_params=loss_params)


def _one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize(
    ("loss", "loss_params", "cfg", "expected"),
    [
        ("dpo", {"beta": 0.5}, {"beta": 0.2}, "DPOConfig.beta=0.2 and loss_params['beta']=0.5 disagree"),
        ("0.5*dpo + sft", {"dpo.beta": 0.5}, {"beta": 0.2}, "loss_params['dpo.beta']=0.5 disagree"),
        ("dpo", None, {"label_smoothing": 0.1}, "DPOConfig.label_smoothing=0.1 has no meaning for loss 'dpo'"),
        ("dpo", None, {"loss_type": "ipo"}, "DPOConfig.loss_type=['ipo'] does not apply with loss='dpo'"),
        ("dpo", None, {"loss_weights": [1.0]}, "loss_weights"),
        # TRL's switches that prefzoo has as modifiers: refused only where the modifier does not apply
        ("simpo", None, {"sync_ref_model": True}, "DPOConfig.sync_ref_model=True (prefzoo modifier 'tr-dpo') does "
         "not apply to loss 'simpo': tr-dpo applies to losses with a reference model"),
        ("dpo", None, {"ld_alpha": 1.5}, "DPOConfig.ld_alpha=1.5 is out of range for prefzoo modifier 'ld-dpo'"),
        ("dpo", None, {"ld_alpha": 0.5, "precompute_ref_log_probs": True},
         "needs the reference's per-token log-probs, which precomputed reference columns do not hold"),
        (prefzoo.modify("dpo", "wpo"), None, {}, "computes only with DPOConfig(use_weighting=True)"),
        (prefzoo.modify("dpo", "wpo"), None, {"use_weighting": True}, "both apply modifier 'wpo': set it once"),
        ("dpo", {"gamma": 1.0}, {}, "loss 'dpo' has no parameter 'gamma'"),
        ("simpo", {"beta": -1.0}, {}, "'beta' = -1.0 must be > 0.0"),
        (prefzoo.get_loss("dpo", beta=0.3), None, {"beta": 0.2}, "has beta=0.3: set it once"),
        (prefzoo.get_loss("dpo"), {"beta": 0.3}, {}, "with a Loss object"),
    ],
)
def test_a_bad_loss_argument_is_one_line_before_loading(tmp_path, loss, loss_params, cfg, expected):
    with pytest.raises(LossParamError) as excinfo:
        _construct(tmp_path, loss, loss_params, **cfg)
    assert expected in _one_line(excinfo)


@pytest.mark.parametrize(
    ("loss_params", "cfg", "expected"),
    [
        ({"beta": 0.5}, {"beta": 0.2}, "DPOConfig.beta=0.2 and loss_params['beta']=0.5 disagree"),
        (None, {"loss_type": "ipo"}, "DPOConfig.loss_type=['ipo'] does not apply with loss='dpo'"),
    ],
)
def test_the_config_is_read_when_trl_dpotrainer_is_the_adapter(tmp_path, monkeypatch, loss_params, cfg, expected):
    """``trl.DPOTrainer = prefzoo.integrations.trl.DPOTrainer`` (a drop-in applied across a codebase): the adapter
    still finds DPOConfig among its arguments, positional or keyword, and still refuses what it refused."""
    import trl

    from prefzoo.integrations import trl as adapter

    monkeypatch.setattr(trl, "DPOTrainer", adapter.DPOTrainer)
    with pytest.raises(LossParamError) as excinfo:
        _construct(tmp_path, "dpo", loss_params, **cfg)
    assert expected in _one_line(excinfo)
    seen = []
    monkeypatch.setattr(adapter.dpo, "resolve_loss", lambda loss, params, config: seen.append(config) or 1 / 0)
    args = config(tmp_path, beta=0.5)
    with pytest.raises(ZeroDivisionError):
        trl.DPOTrainer("no-model", args=args, loss="dpo")
    assert seen == [args]  # bound by keyword too, and handed to the loss as it is: beta 0.5, not the default 0.1


def test_an_unknown_loss_names_close_ones(tmp_path):
    with pytest.raises(prefzoo.UnknownLossError) as excinfo:
        _construct(tmp_path, "mmpoo")
    assert "unknown loss 'mmpoo'; did you mean 'mmpo'" in _one_line(excinfo)
    with pytest.raises(TypeError, match="loss= takes a registered name"):
        _construct(tmp_path, 3)


def test_loss_params_without_loss(tmp_path):
    with pytest.raises(LossParamError, match="loss_params= needs loss="):
        _construct(tmp_path, None, {"beta": 0.1})


def test_dpoconfig_fields_of_the_same_meaning_reach_the_loss():
    from prefzoo.integrations.trl import resolve_loss

    cfg = config(Path("unused"), beta=0.25, label_smoothing=0.2, f_divergence_type="js_divergence")
    loss = resolve_loss("robust", None, cfg)
    assert (loss.params.beta, loss.params.label_smoothing, loss.params.f_divergence) == (0.25, 0.2, "js_divergence")
    # a default DPOConfig value gives way to loss_params; a term without the parameter does not get it
    combo = resolve_loss("0.5*dpo + 0.5*sft", {"dpo.beta": 0.7}, config(Path("unused")))
    assert combo.terms[0][1].params.beta == 0.7
    assert resolve_loss("simpo", None, config(Path("unused"))).params.beta == 0.1  # DPOConfig's default β, as TRL


@pytest.mark.parametrize("name", ["kto", "bco", "apo-zero-unpaired"])
def test_a_loss_that_does_not_take_pairs_is_refused_naming_it(tmp_path, name):
    with pytest.raises(LossParamError) as excinfo:
        _construct(tmp_path, name)
    assert f"loss {name!r} takes unpaired batches, but TRL's DPOTrainer gives (chosen, rejected) pairs only: use " \
        "prefzoo.integrations.trl.KTOTrainer" in _one_line(excinfo)


def test_trls_switches_become_prefzoo_modifiers_on_every_term_they_apply_to():
    from prefzoo.integrations.trl import resolve_loss

    def cfg(**kw):
        return config(Path("unused"), **kw)

    loss = resolve_loss("simpo", None, cfg(use_weighting=True, ld_alpha=0.3))
    assert loss.name == "simpo[ld-dpo,wpo]" and loss.params.ld_dpo_alpha == 0.3
    combo = resolve_loss("0.5*dpo + 0.5*simpo", None, cfg(ld_alpha=0.4))
    assert [t.name for _, t in combo.terms] == ["dpo[ld-dpo]", "simpo[ld-dpo]"]
    # TR-DPO moves the run's reference: it modifies the terms that have one, and leaves sft as it is
    synced = resolve_loss("0.5*dpo + 0.5*sft", None, cfg(sync_ref_model=True, ref_model_sync_steps=7))
    assert [t.name for _, t in synced.terms] == ["dpo[tr-dpo]", "sft"]
    assert synced.terms[0][1].params.tr_dpo_sync_steps == 7


def test_a_list_loss_takes_pairs_as_groups_of_two():
    from prefzoo.integrations.trl import resolve_loss

    assert resolve_loss("mmpo-list", None, None).name == "mmpo-list"  # LossSpec.accepts(Shape.PAIR): K = 2
    assert resolve_loss("0.5*dpo + 0.5*mmpo-list", None, None).spec.accepts(Shape.PAIR)
    dpo = prefzoo.loss_spec("dpo")
    unpaired = prefzoo.Loss(dataclasses.replace(dpo, name="unpaired-test", shapes=frozenset({Shape.UNPAIRED})),
                            dpo.params())  # fmt: skip
    with pytest.raises(LossParamError, match="loss 'unpaired-test' takes unpaired batches"):
        resolve_loss(unpaired, None, None)


def test_a_trl_outside_the_range_is_one_line_naming_it(monkeypatch):
    import trl

    from prefzoo.integrations import trl as integration

    rng = integration.TRL_RANGE
    for version in ("1.15.2", "1.17.0", "0.19.1", "not-a-version"):
        with pytest.raises(integration.TRLVersionError) as excinfo:
            integration.check_trl_version(version)
        assert _one_line(excinfo) == (
            f"prefzoo.integrations.trl supports trl{rng}, found trl {version}: "
            f"pip install -e \".[trl]\" from the prefzoo clone, or pip install 'prefzoo[trl]' (or 'trl{rng}')"
        )
    integration.check_trl_version(trl.__version__)
    monkeypatch.setattr(trl, "__version__", "1.17.0")  # the import itself checks
    monkeypatch.delitem(sys.modules, "prefzoo.integrations.trl")
    with pytest.raises(ImportError, match=r"supports trl>=1\.16,<1\.17, found trl 1\.17\.0") as excinfo:
        importlib.import_module("prefzoo.integrations.trl")  # a fresh module: its own TRLVersionError class
    assert type(excinfo.value).__name__ == "TRLVersionError"


def test_the_trl_extra_pins_the_checked_range():
    import tomllib

    from prefzoo.integrations.trl import TRL_RANGE

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"trl{TRL_RANGE}" in extras["trl"]


def test_a_policy_that_diverges_in_float16_stops_in_one_line_naming_step_and_dtype(trl_model_dir, tmp_path):
    """TRL's ``test_train_model_dtype`` at learning rate 0.1 in float16: TRL's own trainer goes on with NaN weights;
    the adapter stops at the first non-finite log-prob with the step, the dtype and what to try."""
    import torch

    from prefzoo.integrations.trl import PolicyDivergedError
    from tests.integrations.trl_support import make_pairs, train

    with pytest.raises(PolicyDivergedError) as excinfo:
        train(trl_model_dir, tmp_path, make_pairs(8), adapter=True, loss="dpo", optim="adamw_torch",
              learning_rate=0.1, max_steps=4, model_init_kwargs={"dtype": torch.float16})  # fmt: skip
    text = _one_line(excinfo)
    assert text.startswith("the policy diverged at step 2 in float16: its sequence log-probs are nan"), text
    assert "lower learning_rate" in text and "bf16=True" in text, text


def test_the_divergence_check_names_the_dtype_and_passes_finite_log_probs():
    import torch

    from prefzoo.integrations.trl import PolicyDivergedError, check_policy_finite

    check_policy_finite(torch.tensor([-3.0, -7.5]), 1, torch.float32)  # finite: nothing happens
    with pytest.raises(PolicyDivergedError, match=r"at step 5 in bfloat16: .* are inf \(1 of 2 sequences\)"):
        check_policy_finite(torch.tensor([float("inf"), -1.0]), 5, torch.bfloat16)
