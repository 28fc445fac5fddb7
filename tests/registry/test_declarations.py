"""What each built-in loss declares, read from a registry built fresh in the test.

The declarations choose which properties run: a wrong ``True`` fails a property, but a wrong ``False``
(``shift_invariant``, ``monotone``, ``reward_difference``) silently skips one.  So they are pinned here, and the
strings (formula, paper, scores, description, notes) are pinned by the committed catalogue (docs/losses/).
Building the registry inside the test re-runs every module's ``prefzoo_register_losses`` (and its ``_spec``
helpers): mutation testing forks from a process whose registry is already built, so a test that only reads the
process's registry cannot see a mutant there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prefzoo import Need, Shape, registry
from prefzoo.cli.losses import catalogue_pages

R, L, KL = Need.REFERENCE, Need.LENGTHS, Need.KL_REFERENCE

# name: (monotone, shift_invariant, batch_coupled, reward_difference) at default params, needs, shapes
DECLARED = {
    "aot": (True, False, True, False, {R}, Shape.PAIR),
    "aot-unpaired": (True, True, True, False, {R}, Shape.PAIR),
    "apo-down": (False, True, False, False, {R}, Shape.PAIR),
    "apo-zero": (True, True, False, False, {R}, Shape.PAIR),
    "apo-zero-unpaired": (True, True, False, False, {R}, Shape.UNPAIRED),
    "bco": (True, True, True, False, {R}, Shape.UNPAIRED),
    "bco-pair": (True, True, False, False, {R}, Shape.PAIR),
    "cdpo": (False, True, False, True, {R}, Shape.PAIR),
    "cpo": (True, False, False, False, {L}, Shape.PAIR),
    "cpo-hinge": (True, False, False, False, {L}, Shape.PAIR),
    "cpo-ipo": (False, False, False, False, {L}, Shape.PAIR),
    "cpo-simpo": (True, False, False, False, {L}, Shape.PAIR),
    "discopop": (False, True, False, True, {R}, Shape.PAIR),
    "dpo": (True, True, False, True, {R}, Shape.PAIR),
    "dpo-pl": (True, True, False, False, {R}, Shape.LIST),
    "dpop": (True, True, False, False, {R}, Shape.PAIR),
    "exo-pair": (False, True, False, True, {R}, Shape.PAIR),
    "hinge": (True, True, False, True, {R}, Shape.PAIR),
    "ipo": (False, True, False, False, {R, L}, Shape.PAIR),
    "kto": (True, True, True, False, {R, KL}, Shape.UNPAIRED),
    "lipo": (True, True, False, False, {R}, Shape.LIST),
    "mml": (False, False, True, False, {R}, Shape.LIST),
    "mmpo": (True, False, True, False, {R}, Shape.PAIR),
    "mmpo-entropy": (False, False, True, False, {R, Need.TOKEN_ENTROPIES, Need.TOKEN_LOGPS}, Shape.PAIR),
    "mmpo-length-norm": (True, False, True, False, {R, L}, Shape.PAIR),
    "mmpo-list": (True, False, True, False, {R}, Shape.LIST),
    "mmpo-no-aux": (False, False, True, False, {R}, Shape.PAIR),
    "mmpo-no-norm": (True, False, False, False, {R}, Shape.PAIR),
    "mpo": (True, False, False, False, {R, L}, Shape.PAIR),
    "nca-pair": (False, True, False, False, {R}, Shape.PAIR),
    "orpo": (True, False, False, False, {L}, Shape.PAIR),
    "rdpo": (True, True, False, True, {R, L}, Shape.PAIR),
    "robust": (True, True, False, True, {R}, Shape.PAIR),
    "rpo": (True, False, True, False, {R, L}, Shape.PAIR),
    "rrhf": (True, False, False, False, {L}, Shape.LIST),
    "sft": (True, False, False, False, {L}, Shape.PAIR),
    "sigmoid-norm": (True, True, False, False, {R, L}, Shape.PAIR),
    "simper": (True, False, False, False, {L}, Shape.PAIR),
    "simpo": (True, False, False, False, {L}, Shape.PAIR),
    "slic": (True, False, False, False, set(), Shape.PAIR),
    "sppo-hard": (False, True, False, False, {R}, Shape.PAIR),
}
# losses whose declarations change with their params: (params, monotone, batch_coupled, reward_difference)
PER_PARAMS = {
    "dpo": [({"f_divergence": "forward_kl"}, True, False, False),
            ({"f_divergence": "js_divergence"}, True, False, False)],
    "hinge": [({"f_divergence": "alpha_divergence"}, True, False, False)],
    "aot": [({"label_smoothing": 0.1}, False, True, False)],
    "aot-unpaired": [({"label_smoothing": 0.1}, False, True, False)],
    **{n: [({"nll_reduction": "batch-tokens"}, m, True, False)]
       for n, m in [("sft", True), ("cpo", True), ("cpo-hinge", True), ("cpo-ipo", False), ("cpo-simpo", True),
                    ("orpo", True)]},
}


@pytest.fixture(scope="module")
def fresh():
    return registry.build_registry(autoload=False)


def test_every_builtin_declares_what_its_math_is(fresh):
    builtins = {n for n in fresh.names() if fresh.specs[n].builtin}
    assert builtins == set(DECLARED)
    for name, (mono, shift, coupled, rd, needs, shape) in DECLARED.items():
        s = fresh.specs[name]
        p = s.params_cls()
        got = (s.is_monotone(p), s.shift_invariant, s.is_batch_coupled(p), s.is_reward_difference(p), set(s.needs),
               set(s.shapes))
        assert got == (mono, shift, coupled, rd, needs, {shape}), name


@pytest.mark.parametrize("name", sorted(PER_PARAMS))
def test_declarations_that_depend_on_the_params(fresh, name):
    s = fresh.specs[name]
    for kw, mono, coupled, rd in PER_PARAMS[name]:
        p = s.params(**kw)
        assert (s.is_monotone(p), s.is_batch_coupled(p), s.is_reward_difference(p)) == (mono, coupled, rd), kw


def test_a_fresh_registry_renders_the_committed_catalogue(fresh):
    """docs/losses.md and docs/losses/*.md pin each spec's strings; tests/cli checks the process's registry, this one
    a fresh build."""
    old = registry.get_registry()
    registry.reset_registry(fresh)
    try:
        rendered = catalogue_pages()
    finally:
        registry.reset_registry(old)
    docs = Path(__file__).resolve().parents[2] / "docs"
    stale = [rel for rel, text in rendered.items() if (docs / rel).read_text(encoding="utf-8") != text]
    assert not stale, f"{stale} stale: run `prefzoo losses --markdown-dir docs`"
