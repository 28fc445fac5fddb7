"""The saved model is a Hugging Face model (issue 16): model-card front matter, --push-to-hub against a local stand-in
for the hub's HTTP API (tests/support/hub_stub.py: the real huggingface_hub upload code runs), and `prefzoo export`."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from prefzoo.cli.main import main
from tests.support.hub_stub import HubStub
from tests.train.helpers import base_config, run_inprocess


def _front_matter(readme):
    text = readme.read_text()
    assert text.startswith("---\n"), text[:80]
    return yaml.safe_load(text.split("---\n")[1])


def test_the_final_readme_is_a_model_card_with_front_matter(tmp_path, tiny_dir, pairs_file):
    from huggingface_hub import ModelCard

    cfg = base_config(tiny_dir, pairs_file, tmp_path, loss="simpo", max_steps=2, loss_params={"beta": 2.5})
    res = run_inprocess(cfg)
    meta = _front_matter(res.final_dir / "README.md")
    assert meta["base_model"] == str(tiny_dir) and meta["library_name"] == "transformers"
    assert meta["datasets"] == [str(pairs_file)] and {"prefzoo", "simpo"} <= set(meta["tags"])
    assert meta["prefzoo"]["loss"] == "simpo"
    # the one given, and the defaults
    assert meta["prefzoo"]["loss_params"] == {"beta": 2.5, "gamma_beta_ratio": 0.5, "label_smoothing": 0.0}
    assert meta["prefzoo"]["steps"] == 2 and meta["prefzoo"]["metrics"]["loss"] == res.history[-1]["loss"]
    card = ModelCard.load(res.final_dir / "README.md")  # the hub's own parser reads it
    assert card.data.base_model == str(tiny_dir) and "prefzoo" in card.data.tags


def test_the_model_card_lists_every_parameter_of_the_loss_defaults_included(tmp_path, tiny_dir, pairs_file):
    """Issue 49: a run with the loss's defaults showed ``loss_params: {}``; the card lists what the run used."""
    out = tmp_path / "run"
    flags = ["--loss", "dpo", "--model", str(tiny_dir), "--dataset", str(pairs_file), "--max-steps", "1",
             "--output-dir", str(out), "--report-to", "none", "--no-progress"]  # fmt: skip
    assert main(["train", *flags]) == 0
    params = _front_matter(out / "final" / "README.md")["prefzoo"]["loss_params"]
    assert params == {"beta": 0.1, "f_divergence": "reverse_kl", "alpha_divergence_coef": 0.5}, params
    card = json.loads((out / "final" / "run_card.json").read_text())
    assert card["loss_params"] == params and card["config"]["loss_params"] == {}  # the config keeps what was given


def test_an_adapter_s_card_says_peft(tmp_path, tiny_dir, pairs_file):
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path, lora=True, lora_r=4, max_steps=1))
    meta = _front_matter(res.final_dir / "README.md")
    assert meta["library_name"] == "peft" and "lora" in meta["tags"]


@pytest.fixture
def hub(monkeypatch):
    """huggingface_hub pointed at a local stub (the suite runs with HF_HUB_OFFLINE=1; this test turns it off)."""
    import huggingface_hub.constants as constants

    with HubStub() as stub:
        monkeypatch.setattr(constants, "ENDPOINT", stub.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        yield stub


def test_push_to_hub_uploads_the_final_folder(tmp_path, tiny_dir, pairs_file, hub, capsys):
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path, max_steps=1, push_to_hub="me/tiny-dpo"))
    files = hub.repos["me/tiny-dpo"]
    local = {p.name: p.read_bytes() for p in res.final_dir.iterdir() if p.is_file()}
    assert {"model.safetensors", "config.json", "README.md", "run_card.json", "tokenizer_config.json"} <= set(files)
    assert files == local  # every file, byte for byte
    assert hub.commits == [{"repo": "me/tiny-dpo", "summary": "prefzoo dpo run"}]
    assert set(hub.auth) == {"Bearer hf_test_token"}
    assert len(hub.validated) == 1 and "base_model:" in hub.validated[0]  # the hub checked the card's YAML
    assert f"pushed {res.final_dir} to {hub.url}/me/tiny-dpo" in capsys.readouterr().out


def test_push_to_hub_failures_are_one_line_and_keep_the_model(tmp_path, tiny_dir, pairs_file, monkeypatch, capsys):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    args = ["--model", str(tiny_dir), "--dataset", str(pairs_file), "--output-dir", str(tmp_path), "--report-to",
            "none", "--max-steps", "1", "--no-progress", "--push-to-hub", "me/x"]  # fmt: skip
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HF_HUB_OFFLINE is set" in err and f"hf upload me/x {tmp_path / 'final'}" in err
    assert (tmp_path / "final" / "model.safetensors").is_file()


def test_a_repo_id_is_checked_before_anything_loads():
    from prefzoo.train.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="give the hub repo id"):
        TrainConfig(push_to_hub="true")  # TRL's boolean push_to_hub


def test_export_merges_an_adapter_into_a_plain_folder_with_the_same_logits(tmp_path, tiny_dir, pairs_file, capsys):
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    run_inprocess(base_config(tiny_dir, pairs_file, run, lora=True, lora_r=4, max_steps=3, lr=1e-2))
    out = tmp_path / "merged"
    assert main(["export", str(run), "--output", str(out)]) == 0  # a run's output dir means its final/ adapter
    assert f"plain transformers folder {out}" in capsys.readouterr().out
    assert not (out / "adapter_config.json").exists() and (out / "config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    adapter = AutoPeftModelForCausalLM.from_pretrained(str(run / "final")).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    x = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    with torch.no_grad():
        want, got, before = (m(input_ids=x).logits for m in (adapter, merged, base))
    assert (want - before).abs().max() > 1e-4  # the adapter changed the model: the comparison can fail
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert _front_matter(out / "README.md")["library_name"] == "transformers"


def test_export_errors_are_one_line(tmp_path, tiny_dir, capsys):
    assert main(["export", str(tiny_dir), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no adapter_config.json, so nothing to merge" in err and "already a plain" in err
    assert main(["export", str(tmp_path / "nope"), "--output", str(tmp_path / "o")]) == 2
    assert "no such folder" in capsys.readouterr().err
