"""prefzoo._attrs.temporarily: the attribute is set for the block and then as it was, on an exception too."""

from __future__ import annotations

import pytest
from torch import nn

from prefzoo._attrs import temporarily


class _Config:
    rate = 0.1  # a class default, shadowed per instance

    def __init__(self) -> None:
        self._impl = "eager"

    @property
    def impl(self) -> str:
        return self._impl

    @impl.setter
    def impl(self, value: str) -> None:
        self._impl = value


def test_an_own_attribute_is_put_back_even_after_an_exception():
    cfg = _Config()
    cfg.rate = 0.3
    with pytest.raises(RuntimeError), temporarily(cfg, "rate", 0.0):
        assert cfg.rate == 0.0
        raise RuntimeError
    assert cfg.rate == 0.3 and vars(cfg)["rate"] == 0.3


def test_an_attribute_added_over_a_class_default_or_method_is_deleted_again():
    cfg, lin = _Config(), nn.Linear(2, 2)
    with temporarily(cfg, "rate", 0.0), temporarily(lin, "forward", lambda x: x):
        assert cfg.rate == 0.0 and "forward" in vars(lin)
    assert "rate" not in vars(cfg) and cfg.rate == 0.1
    assert "forward" not in vars(lin)  # the class's method again, not a bound copy left on the instance


def test_a_property_is_set_back_through_its_setter():
    cfg = _Config()
    with temporarily(cfg, "impl", "split"):
        assert cfg.impl == "split"
    assert cfg.impl == "eager" and "impl" not in vars(cfg)


def test_field_defaults_reads_defaults_and_calls_each_factory_once():
    import dataclasses

    from prefzoo._attrs import field_defaults

    @dataclasses.dataclass
    class C:
        need: int
        a: int = 3
        b: list[int] = dataclasses.field(default_factory=lambda: [1])

    assert field_defaults(C) == {"a": 3, "b": [1]}
    assert field_defaults(C)["b"] is not field_defaults(C)["b"]
