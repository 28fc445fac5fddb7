"""Generic properties of every registered loss, parametrized over list_losses(): plugins are tested for free.

Each (loss, property) pair is one test running the conformance kit's property
with Hypothesis.  ``PREFZOO_TEST_DTYPES`` selects the dtypes drawn (the tox envs
props-fp64, props-fp32, props-bf16); dtype-independent properties, which compute
in float64 whatever they are given, run in the float64 selection only.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import prefzoo
from prefzoo.testing import GENERIC_PROPERTIES, check_loss, dtypes_from_env, preference_batches

DTYPES = dtypes_from_env()
# examples per (loss, property); default: the Hypothesis profile's.  tox sets it to keep ~300 tests under budget.
EXAMPLES = int(os.environ["PREFZOO_GENERIC_EXAMPLES"]) if os.environ.get("PREFZOO_GENERIC_EXAMPLES") else None
DTYPE_DEPENDENT = {"finite", "monotone", "shape", "detached-rewards"}
LOW_PRECISION = tuple(d for d in DTYPES if d != "float64")


def _cases():
    for name in prefzoo.list_losses():
        spec = prefzoo.loss_spec(name)
        if not spec.accepts(prefzoo.Shape.PAIR):
            continue  # unpaired losses: tests/properties/test_unpaired.py
        for prop in [*GENERIC_PROPERTIES, None]:
            pname = prop.name if prop else "reference"
            if prop is not None and not prop.applies(spec):
                continue
            yield pytest.param(name, pname, id=f"{name}-{pname}")


@pytest.mark.parametrize(("name", "prop"), list(_cases()))
def test_property(name, prop):
    if prop == "low-precision" and not LOW_PRECISION:
        pytest.skip("low-precision runs where PREFZOO_TEST_DTYPES selects float32 or bfloat16")
    if prop not in DTYPE_DEPENDENT | {"low-precision"} and "float64" not in DTYPES:
        pytest.skip("dtype-independent property (computes in float64): run by the float64 selection")
    if prop == "reference":
        from prefzoo.testing.reference import REFERENCES

        if name not in REFERENCES or not prefzoo.loss_spec(name).builtin:
            pytest.skip(f"no float64 reference formula in prefzoo.testing.reference for {name!r}")
    dts = LOW_PRECISION if prop == "low-precision" else DTYPES
    report = check_loss(name, properties=[prop], dtypes=dts, max_examples=EXAMPLES)
    report.raise_if_failed()


def test_every_shipped_loss_has_a_reference_or_a_dedicated_test():
    from prefzoo.testing.reference import REFERENCES

    specs = [prefzoo.loss_spec(n) for n in prefzoo.list_losses()]
    builtin = [s.name for s in specs if s.builtin and s.accepts(prefzoo.Shape.PAIR)]  # unpaired: test_unpaired.py
    missing = [n for n in builtin if n not in REFERENCES and n != "mmpo-entropy"]  # entropy: test_entropy.py
    assert not missing, missing


@given(batch=preference_batches(reference=False, dtypes=DTYPES), beta=st.floats(1e-3, 10.0))
def test_dpo_is_log2_when_policy_equals_reference(batch, beta):
    b = batch.replace(ref_chosen_logps=batch.policy_chosen_logps.clone(),
                      ref_rejected_logps=batch.policy_rejected_logps.clone())
    out = prefzoo.get_loss("dpo", beta=beta)(b)
    torch.testing.assert_close(out.losses.double(), torch.full((b.batch_size,), math.log(2), dtype=torch.float64),
                               rtol=0, atol=1e-7)
    assert bool((out.chosen_rewards == 0).all()) and bool((out.rejected_rewards == 0).all())
