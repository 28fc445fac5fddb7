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
        ("dpo", None, {"use_weighting": True}, "use_weighting"),
        ("dpo", None, {"ld_alpha": 0.5}, "ld_alpha"),
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


@pytest.mark.parametrize("name", ["kto", "bco"])
def test_a_loss_that_does_not_take_pairs_is_refused_naming_it(tmp_path, name):
    with pytest.raises(LossParamError) as excinfo:
        _construct(tmp_path, name)
    assert f"loss {name!r} takes unpaired batches, but TRL's DPOTrainer gives (chosen, rejected) pairs only" in (
        _one_line(excinfo)
    )


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
            f"pip install 'prefzoo[trl]' (or 'trl{rng}')"
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
