"""Untrusted files: no unrestricted pickle, no remote code, a validated reference-log-prob cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import prefzoo
from prefzoo.scoring import Reference, load_or_compute_reference_table
from prefzoo.scoring.reference_cache import _cache_file
from prefzoo.train.checkpoint.save import ResumeError, find_latest_checkpoint
from tests.faults._run import reseal
from tests.train.helpers import base_config, run_inprocess

PKG = Path(prefzoo.__file__).parent


def test_no_unrestricted_loads_or_remote_code_in_the_package():
    offenders = []
    for path in PKG.rglob("*.py"):
        src = path.read_text()
        for m in re.finditer(r"torch\.load\(([^)]*)\)", src):
            if "weights_only=True" not in m.group(1):
                offenders.append(f"{path}: torch.load without weights_only=True")
        if re.search(r"\bpickle\.loads?\(|\bdill\.|\bjoblib\.load\(", src):
            offenders.append(f"{path}: pickle/dill/joblib load")
        if re.search(r"trust_remote_code\s*=\s*True", src):
            offenders.append(f"{path}: trust_remote_code=True")
    assert not offenders, offenders


class _Bomb:
    """Unpickling this calls Path.touch(target): proof that a loader executed pickle code."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


def test_pickle_bomb_in_a_checkpoint_is_refused_not_executed(tmp_path, tiny_dir, pairs_file):
    out = tmp_path / "run"
    kw = dict(max_steps=2, save_steps=1)
    run_inprocess(base_config(tiny_dir, pairs_file, out, **kw))
    ckpt = find_latest_checkpoint(out)
    proof = tmp_path / "pwned"
    opt = ckpt / "optimizer.bin"
    torch.save({"state": _Bomb(proof)}, opt)
    reseal(ckpt)  # the attacker also fixes the marker: sizes and sha256
    with pytest.raises(ResumeError, match=r"optimizer.bin would need full pickle to load.*refuses this file"):
        run_inprocess(base_config(tiny_dir, pairs_file, out, max_steps=4, save_steps=1, resume="auto"))
    assert not proof.exists()


def test_model_folder_with_custom_code_is_not_executed(tmp_path, tiny_dir):
    from prefzoo.model.loading import load_model_and_tokenizer

    evil = tmp_path / "evil-model"
    evil.mkdir()
    for f in tiny_dir.iterdir():
        (evil / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((evil / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (evil / "config.json").write_text(json.dumps(cfg))
    proof = tmp_path / "pwned"
    (evil / "evil.py").write_text(f"open({str(proof)!r}, 'w').write('ran')\n")
    try:
        load_model_and_tokenizer(str(evil))
    except Exception:
        pass  # refusing is fine; running the code is not
    assert not proof.exists()
    # the opt-in really is the gate: with --trust-remote-code the folder's code runs
    try:
        load_model_and_tokenizer(str(evil), trust_remote_code=True)
    except Exception:
        pass  # evil.py defines no classes
    assert proof.exists()


def test_trust_remote_code_is_an_explicit_off_by_default_flag():
    from prefzoo.cli.main import build_parser
    from prefzoo.train.config import TrainConfig

    assert TrainConfig().trust_remote_code is False
    assert "--trust-remote-code" in build_parser()._subparsers._group_actions[0].choices["train"].format_help()


class _CountingReference(Reference):
    def __init__(self, offset: float = 0.0) -> None:
        self.calls = 0
        self.offset = offset

    def __call__(self, batch):
        self.calls += 1
        base = torch.tensor([float(i[1:]) for i in batch["ids"]])  # (B,)
        return -base - 1.0 + self.offset, -base - 2.0 + self.offset


class _OneProcess:
    is_main_process = is_local_main_process = True
    num_processes = 1

    def gather_for_metrics(self, t):
        return t

    def gather(self, t):
        return t

    def wait_for_everyone(self):
        pass


IDS = [f"p{i}" for i in range(6)]
BATCHES = [{"ids": IDS[:4]}, {"ids": IDS[4:]}]


def _table(cache, key="model-a|data-1", ref=None):
    ref = ref or _CountingReference()
    table, hit = load_or_compute_reference_table(ref, BATCHES, _OneProcess(), key, IDS, cache)
    return table, hit, ref


def _tamper(path, fn):
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta, logps = f.metadata(), f.get_tensor("logps")
    logps, meta = fn(logps.clone(), dict(meta))
    save_file({"logps": logps}, str(path), metadata=meta)


@pytest.mark.parametrize(
    "tamper",
    [
        "value",  # one number changed, metadata kept: the checksum catches it
        "nan",
        "garbage",  # not a safetensors file at all
        "ids",  # another dataset's ids
        "shape",
        "key",  # another model / dataset fingerprint / tokenization
    ],
)
def test_tampered_or_mismatched_reference_cache_is_recomputed(tmp_path, tamper):
    cache = tmp_path / "cache"
    first, hit, ref = _table(cache)
    assert not hit and ref.calls == 2 and first["p3"] == (-4.0, -5.0)
    again, hit, ref = _table(cache)
    assert hit and ref.calls == 0 and again == first  # a valid cache is reused
    path = _cache_file(cache, "model-a|data-1")
    if tamper == "value":
        _tamper(path, lambda t, m: (t.index_fill_(0, torch.tensor([3]), 123.0), m))
    elif tamper == "nan":
        _tamper(path, lambda t, m: (t.index_fill_(0, torch.tensor([1]), float("nan")), {**m, "sha256": "x"}))
    elif tamper == "garbage":
        path.write_bytes(b"\x80\x04 not safetensors")
    elif tamper == "ids":
        _tamper(path, lambda t, m: (t, {**m, "ids": json.dumps([f"q{i}" for i in range(6)])}))
    elif tamper == "shape":
        _tamper(path, lambda t, m: (t[:-1], m))
    elif tamper == "key":
        _tamper(path, lambda t, m: (t, {**m, "key": "model-b|data-1"}))
    fixed, hit, ref = _table(cache)
    assert not hit and ref.calls == 2 and fixed == first


def test_cache_of_another_model_is_never_used(tmp_path):
    cache = tmp_path / "cache"
    _table(cache, key="model-a|data-1")
    other, hit, ref = _table(cache, key="model-b|data-1", ref=_CountingReference(offset=10.0))
    assert not hit and ref.calls == 2 and other["p0"] == (9.0, 8.0)
