"""Every registered loss trains through the same loop; the loop, the CLI and evaluation never branch on a loss name."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

import prefzoo.train as train_pkg
from prefzoo.registry import list_losses, loss_spec
from prefzoo.types import Shape
from tests.train.helpers import base_config, params_of, run_inprocess


def branches_on_loss_names(paths, names) -> list[str]:
    """Every place in ``paths`` (Python files) where code branches on a loss name: a loss name as a string constant
    in a comparison (``== "dpo"``, ``in ("dpo", "ipo")``), a ``match`` case, or a dict key (a dispatch table).

    A name in a default value, a help text, a docstring or a comment is not a branch and is not reported.
    """
    names = set(names)
    found = []

    def loss_constants(node):
        return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in names]

    for path in paths:
        tree = ast.parse(Path(path).read_text(), filename=str(path))
        for node in ast.walk(tree):
            hits: list[str] = []
            if isinstance(node, ast.Compare):
                hits = loss_constants(node)
            elif isinstance(node, ast.MatchValue):
                hits = loss_constants(node.value)
            elif isinstance(node, ast.Dict):
                hits = [h for k in node.keys if k is not None for h in loss_constants(k)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "startswith", "endswith"
            ):
                hits = [h for a in node.args for h in loss_constants(a)]
            found += [f"{Path(path).name}:{node.lineno} branches on loss {h!r}" for h in hits]
    return found


# cli/features.py keys the README's comparison table (other frameworks' option for each loss) by loss name: it is
# documentation data read by `prefzoo losses --features`, never a branch of training, evaluation or a command
NAME_KEYED_DOCS = {"features.py"}


def test_trainer_cli_and_eval_never_branch_on_a_loss_name():
    pkg = Path(train_pkg.__file__).parent.parent
    paths = sorted(p for d in ("train", "cli", "eval") for p in (pkg / d).glob("*.py") if p.name not in NAME_KEYED_DOCS)
    assert len(paths) > 20, paths  # the three packages were found
    assert branches_on_loss_names(paths, list_losses()) == []


def test_the_scan_finds_every_kind_of_branch(tmp_path):
    """The real scan on files that branch on loss names in each way it knows, and on files that only mention one."""
    branches = {
        "eq.py": 'def f(cfg):\n    if cfg.loss == "dpo":\n        return 1\n',
        "ne.py": 'def f(name):\n    return 2 if "simpo" != name else 3\n',
        "in.py": 'def f(name):\n    return name in ("ipo", "orpo")\n',
        "match.py": 'def f(name):\n    match name:\n        case "mmpo":\n            return 1\n',
        "table.py": 'TABLE = {"dpo": 1, "other": 2}\n',
        "prefix.py": 'def f(name):\n    return name.startswith("mmpo")\n',
    }
    mentions = {"ok.py": '"""Trains dpo or mmpo."""\nimport argparse\n\n'
                         'def f(p, cfg):\n    p.add_argument("--loss", default="dpo", help="e.g. simpo")  # mmpo\n'
                         '    return cfg.get("loss", "mmpo")\n'}
    for name, text in {**branches, **mentions}.items():
        (tmp_path / name).write_text(text)
    names = ["dpo", "simpo", "ipo", "orpo", "mmpo"]
    found = branches_on_loss_names(sorted(tmp_path.glob("*.py")), names)
    assert sorted({f.split(":")[0] for f in found}) == sorted(branches), found
    assert branches_on_loss_names([tmp_path / "in.py"], names) == [
        "in.py:2 branches on loss 'ipo'", "in.py:2 branches on loss 'orpo'"]


# the trainer feeds pairs; unpaired losses train once the unpaired data path lands (helper "shapes")
@pytest.mark.parametrize("loss_name", [n for n in list_losses() if loss_spec(n).accepts(Shape.PAIR)])
def test_loss_trains_a_few_steps(tmp_path, tiny_dir, pairs_file, loss_name):
    from transformers import AutoModelForCausalLM

    before = params_of(AutoModelForCausalLM.from_pretrained(tiny_dir))
    res = run_inprocess(base_config(tiny_dir, pairs_file, tmp_path, loss=loss_name, max_steps=2, lr=1e-2))
    assert res.global_step == 2
    assert all(math.isfinite(h["loss"]) for h in res.history)
    after = params_of(res.model)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before), f"{loss_name}: parameters not updated: {set(before) - set(changed)}"
    assert (tmp_path / "final" / "run_card.json").is_file()
