"""TrainConfig's sections: every key in exactly one, checked by its section, shown as one --help group each, while
the keys keep their flat names (attribute, YAML, flag)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import prefzoo
from prefzoo.train.config import SECTIONS, ConfigError, TrainConfig, section_keys

# one out-of-range value per section: the section's own check must name the key
BAD = {
    "loss": ("pairs_from_lists", "best-of-n"),
    "data": ("max_prompt_length", 0),
    "model": ("lora_dropout", 1.5),
    "optimization": ("warmup_ratio", 1.0),
    "fast paths": ("logp_chunk_size", 0),
    "engine": ("fsdp_sharding", "zero3"),
    "checkpointing": ("save_total_limit", 0),
    "evaluation": ("eval_fraction", -0.1),
    "online": ("samples_per_prompt", 0),
    "monitoring": ("logging_steps", 0),
}


def test_every_key_is_in_exactly_one_section_in_the_sections_order() -> None:
    keys = [k for name in SECTIONS for k in section_keys(name)]
    assert len(keys) == len(set(keys))
    assert keys == TrainConfig.keys()  # the run card, to_dict() and --help list them section by section
    assert set(BAD) == set(SECTIONS)


@pytest.mark.parametrize("section", list(SECTIONS))
def test_each_section_checks_its_own_keys(section: str) -> None:
    key, value = BAD[section]
    assert key in section_keys(section)
    with pytest.raises(ConfigError, match=rf"^{key}="):
        TrainConfig(**{key: value})


def test_a_section_reads_and_the_flat_names_round_trip() -> None:
    cfg = TrainConfig(lr=1e-6, grad_accum=4, fsdp_sharding="hybrid")
    assert cfg.section("optimization")["lr"] == 1e-6 and cfg.section("engine")["fsdp_sharding"] == "hybrid"
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert set(TrainConfig.from_dict({"learning_rate": 2e-6}).section("optimization")) == set(
        section_keys("optimization")
    )
    with pytest.raises(ConfigError, match="section 'optimisation': choose one of loss, data, model"):
        cfg.section("optimisation")


def test_help_shows_one_group_per_section_in_order() -> None:
    import argparse

    from prefzoo.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    groups = [g for g in sub.choices["train"]._action_groups if g.title in SECTIONS]
    assert [g.title for g in groups] == list(SECTIONS)
    for g in groups:
        dests = [a.dest for a in g._group_actions if a.help != argparse.SUPPRESS]
        assert list(dict.fromkeys(dests)) == section_keys(g.title)


def test_sections_are_plain_dataclasses_of_their_own_keys() -> None:
    for cls in SECTIONS.values():
        assert dataclasses.is_dataclass(cls) and callable(cls.check)
        assert issubclass(TrainConfig, cls)


def _view_name(section: str) -> str:
    """``cfg.optimization``, ``cfg.fast_paths``; a section named like a key (``loss``): ``cfg.loss_section``."""
    name = section.replace(" ", "_")
    return f"{name}_section" if name in TrainConfig.keys() else name


@pytest.mark.parametrize("section", list(SECTIONS))
def test_each_section_is_a_typed_view_of_the_flat_keys(section: str) -> None:
    cfg = TrainConfig.from_dict({"lr": 3e-6, "loss": "dpo", "lora": True, "save_steps": 7, "judge": "oracle"})
    view = getattr(cfg, _view_name(section))
    assert type(view) is SECTIONS[section]
    assert dataclasses.asdict(view) == cfg.section(section)
    key = section_keys(section)[0]
    before = cfg.to_dict()[key]
    setattr(view, key, "changed")  # a copy: the run's config is unchanged
    assert cfg.to_dict()[key] == before
    assert not set(map(_view_name, SECTIONS)) & set(TrainConfig.keys())  # no view hides a key


# Functions of prefzoo that take the whole run config: a parameter annotated TrainConfig, or, in train/ and cli/,
# one named ``cfg`` or ``config`` that is unannotated or typed Any (below train/ such a name is a model's config).
# The rest take their sections (``build_optimizer(params, cfg.optimization)``), a settings record built once
# (EngineSettings, SplitSettings, StepSettings) or the values they read.  The nine that keep it:
#   train(), loop/supervise._train, Run.__init__ and setup.setup: the run's entry points and composition root, which
#     hand each part its sections;
#   the CLI's _train_default (the default task's config, completed), preflight() and build_loss() (the checks and
#     the loss before any data or model, from the CLI and from train() alike);
#   write_final_model: the run card holds the whole config (to_dict());
#   EngineSettings.of: builds the engines' settings from it, once per run.
WHOLE_CONFIG_LIMIT = 9


def whole_config_functions(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        # below train/ (model/, data/) a ``cfg`` or ``config`` is a model's (Hugging Face's): only the annotation counts
        names = ("cfg", "config") if rel.startswith(("prefzoo/train/", "prefzoo/cli/")) else ()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                note = ast.unparse(arg.annotation) if arg.annotation is not None else None
                if (note is not None and "TrainConfig" in note) or (arg.arg in names and note in (None, "Any")):
                    out.append(f"{rel}:{node.lineno} {node.name}")
                    break
    return out


def test_few_functions_take_the_whole_run_config() -> None:
    found = whole_config_functions(Path(prefzoo.__file__).parent)
    assert len(found) <= WHOLE_CONFIG_LIMIT, "\n".join(found)


def test_the_count_sees_each_way_to_take_the_whole_config(tmp_path: Path) -> None:
    pkg = tmp_path / "prefzoo" / "train"
    pkg.mkdir(parents=True)
    (pkg / "m.py").write_text(
        "def a(cfg): ...\ndef b(x, cfg: Any): ...\ndef c(c: TrainConfig): ...\ndef d(config): ...\n"
        "def e(cfg: OptimizationSection): ...\ndef f(lr: float): ...\n"
    )
    # below train/: a model's config, not the run's, unless the annotation says so
    (tmp_path / "prefzoo" / "model.py").write_text(
        "def g(config): ...\ndef h(cfg: Any): ...\ndef i(c: TrainConfig): ...\n"
    )
    assert [f.split()[-1] for f in whole_config_functions(tmp_path / "prefzoo")] == ["i", "a", "b", "c", "d"]
