"""The sweep's own verdicts on an architecture that goes wrong in one layout only: a fast path that is wrong only in
the shared-prompt layout fails the architecture, and the run-start self-check is tried on that layout, where it
catches the fault (checked on the plain rows it would pass, and the sweep would report a silent wrong result)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import prefzoo.train.logps as logps
from prefzoo.testing.architectures import check_architecture


def test_a_fault_of_the_shared_layout_only_is_checked_on_that_layout(monkeypatch):
    sound = logps.shared_prompt_select

    def scaled(*args, **kw):  # hidden states of shared rows 1% off: log-probs wrong by far more than 1e-4 per token
        out, (h_sel, *rest) = sound(*args, **kw)
        return out, (h_sel * 1.01, *rest)

    monkeypatch.setattr(logps, "shared_prompt_select", scaled)
    res = check_architecture("llama")
    assert res.status == "fail" and res.errors["fused"] < 1e-4, res  # the plain layout is still right
    assert res.reason.startswith("shared-prompt layout differs from the plain rows"), res
    assert res.caught and res.reason.endswith("; the self-check catches it"), res


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ValueError("no tiny config for it\nsecond line"), "cannot be built tiny (ValueError: no tiny config for it)"),
        (ImportError("needs einops\nsecond line"), "needs a package: needs einops"),
    ],
)
def test_an_architecture_that_cannot_be_built_is_a_skip_with_its_first_error_line(monkeypatch, error, reason):
    import prefzoo.testing.architectures as arch

    def fails(model_type):
        raise error

    monkeypatch.setattr(arch, "build_tiny", fails)
    res = check_architecture("llama")
    assert (res.status, res.reason) == ("skip", reason), res
