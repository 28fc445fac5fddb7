"""`TrainConfig`: every training setting as one typed dataclass in named sections, loadable from YAML and flags.

The sections (:mod:`prefzoo.train.config.sections`) group the keys as the docs and ``prefzoo train --help`` do; a
key keeps its flat name everywhere (``cfg.lr``, ``lr:`` in YAML, ``--lr``).  Each section is also a typed view
(``cfg.optimization`` is an :class:`OptimizationSection` of the run's values), so a function that needs one section
takes that section (``build_optimizer(params, cfg.optimization)``) and the type checker sees what it reads; the
four sections whose name is a key (``loss``, ``model``, ``engine``, ``online``) are ``cfg.loss_section``,
``cfg.model_section``, ``cfg.engine_section`` and ``cfg.online_section``.  TRL's option names are read through
:mod:`prefzoo.train.config.aliases`, values through :mod:`prefzoo.train.config.values`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from prefzoo.errors import ConfigError
from prefzoo.train.config.sections import (
    ATTN_IMPLEMENTATIONS,
    LR_SCHEDULERS,
    SECTIONS,
    TORCH_DTYPES,
    CheckpointSection,
    DataSection,
    EngineSection,
    EvaluationSection,
    FastPathSection,
    LossSection,
    ModelSection,
    MonitoringSection,
    OnlineSection,
    OptimizationSection,
)
from prefzoo.train.config.values import coerce, load_yaml_config, resolve_aliases, unknown_keys_message

__all__ = ["ATTN_IMPLEMENTATIONS", "LR_SCHEDULERS", "SECTIONS", "TORCH_DTYPES", "ConfigError", "TrainConfig",
           "field_docs", "load_yaml_config", "resolve_aliases", "section_keys", "unknown_keys_message"]  # fmt: skip


_S = TypeVar("_S")


# The bases are listed last section first: a dataclass takes its bases' fields in reverse order, so the keys
# follow SECTIONS (loss, data, model, ...) in to_dict(), the run card and --help.
@dataclass
class TrainConfig(
    MonitoringSection,
    OnlineSection,
    EvaluationSection,
    CheckpointSection,
    EngineSection,
    FastPathSection,
    OptimizationSection,
    ModelSection,
    DataSection,
    LossSection,
):
    """One training run.  The defaults reproduce the paper's setup for small models.

    Global batch = per_device_batch_size × grad_accum × processes: the paper used 2 × 16 × 4 = 128 pairs.
    """

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Every setting in range, section by section, then the pairs across sections: a ConfigError names the key
        and the fix."""
        for section in SECTIONS.values():
            section.check(self)  # type: ignore[attr-defined]
        if (self.load_in_4bit or self.load_in_8bit) and self.deepspeed:
            raise ConfigError("load_in_4bit/load_in_8bit with --deepspeed is not supported: drop one of them")

    def view(self, section: type[_S]) -> _S:
        """A copy of one section's values as that section's dataclass (changing it changes nothing here)."""
        return section(**{f.name: getattr(self, f.name) for f in dataclasses.fields(section)})  # type: ignore[arg-type]

    @property
    def loss_section(self) -> LossSection:
        return self.view(LossSection)

    @property
    def data(self) -> DataSection:
        return self.view(DataSection)

    @property
    def model_section(self) -> ModelSection:
        return self.view(ModelSection)

    @property
    def optimization(self) -> OptimizationSection:
        return self.view(OptimizationSection)

    @property
    def fast_paths(self) -> FastPathSection:
        return self.view(FastPathSection)

    @property
    def engine_section(self) -> EngineSection:
        return self.view(EngineSection)

    @property
    def checkpointing(self) -> CheckpointSection:
        return self.view(CheckpointSection)

    @property
    def evaluation(self) -> EvaluationSection:
        return self.view(EvaluationSection)

    @property
    def online_section(self) -> OnlineSection:
        return self.view(OnlineSection)

    @property
    def monitoring(self) -> MonitoringSection:
        return self.view(MonitoringSection)

    def section(self, name: str) -> dict[str, Any]:
        """The keys and values of one section (a key of SECTIONS), e.g. ``cfg.section("optimization")``."""
        return {key: getattr(self, key) for key in section_keys(name)}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["adam_betas"] = list(self.adam_betas)
        return d

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(
        cls, values: dict[str, Any], where: str = "config", names: dict[str, str] | None = None
    ) -> TrainConfig:
        """A config from ``values`` (TRL's option names accepted, see prefzoo.train.config.aliases).  An error names a
        key as ``names[key]`` (e.g. the flag it came from), else as ``where: key``."""
        values = resolve_aliases(values, where)
        unknown = sorted(set(values) - set(cls.keys()))
        if unknown:
            raise ConfigError(f"{where}: {unknown_keys_message(unknown, cls.keys())}")
        types_ = typing.get_type_hints(cls)
        names = names or {}
        coerced = {k: coerce(k, v, types_[k], names.get(k, f"{where}: {k}")) for k, v in values.items()}
        cfg = cls(**coerced)
        cfg.__dict__["_given"] = frozenset(values)  # not a field: kept out of to_dict(), the card and --help
        return cfg

    def was_set(self, key: str) -> bool:
        """Whether ``key`` was given (in YAML or a flag) rather than left at its default.  A config built in Python
        (not by :meth:`from_dict`) counts every key as given, so nothing is changed behind its author's back."""
        given = self.__dict__.get("_given")
        return True if given is None else key in given


def section_keys(name: str) -> list[str]:
    """The keys of one section, in declaration order."""
    if name not in SECTIONS:
        raise ConfigError(f"section {name!r}: choose one of {', '.join(SECTIONS)}")
    return [f.name for f in dataclasses.fields(SECTIONS[name])]


def field_docs() -> dict[str, str]:
    """The comment on every TrainConfig key (the ``--help`` text), read from the sections' source."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    for section in SECTIONS.values():
        src = inspect.getsource(section).splitlines()
        for node in ast.parse("\n".join(src)).body[0].body:  # type: ignore[attr-defined]
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                line = src[(node.end_lineno or node.lineno) - 1]
                docs[node.target.id] = line.split("#", 1)[1].strip() if "#" in line else ""
    return docs
