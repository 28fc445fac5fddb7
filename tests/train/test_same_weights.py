"""The trainer split into phases trains bit for bit like the single-function loop it replaced (fixed seed, 1 thread).

The digests below were produced by ``python tests/train/weights_digest.py`` on the code before the split (commit
f4f9dfd, torch 2.13.0 CPU, transformers 5.23).  They pin the exact order of every floating-point operation of a run,
so they are checked only on that stack; a deliberate change to the training maths updates them (rerun the script).
"""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.train.weights_digest import VARIANTS, final_digest

PRE_SPLIT = {
    "default": "45c0eb037f6efaebd5739c18071d1d701c950802c5c01277758cb525a4cbcecd",
    "lora-dpo-shared-prompt": "1cada3a364b884dba65b2368865798d53b880f317c4ecf95c61a34861f16c42f",
    "precomputed-reference-dpo": "860208d4873d25aa705aaf860cb14feb98651f62c64bc49b0a16862143f1aeec",
}
STACK = ("2.13.0", "5.23")


@pytest.mark.parametrize(
    "variant", [pytest.param(v, marks=[] if v == "default" else [pytest.mark.slow]) for v in VARIANTS]
)
def test_final_weights_equal_the_pre_split_loop(tmp_path, variant):
    if not (torch.__version__.startswith(STACK[0]) and transformers.__version__.startswith(STACK[1])):
        pytest.skip(f"digests were recorded with torch {STACK[0]} / transformers {STACK[1]}")
    assert final_digest(tmp_path, variant) == PRE_SPLIT[variant]
