"""TrainConfig's sections: every key in exactly one, checked by its section, shown as one --help group each, while
the keys keep their flat names (attribute, YAML, flag)."""

from __future__ import annotations

import dataclasses

import pytest

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
