"""Loss state (``LossSpec.initial_state``): carried by the bound Loss between calls, advanced only on training
calls, checkpointable (``state_dict`` / ``load_state_dict``; the trainer saves it as ``loss_state.safetensors`` in
each checkpoint), checked like the rest of the output, and kept per term in a combination."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import prefzoo
from prefzoo.spec import LossOutputError
from tests.testing._probes import probe_loss

F64 = torch.float64


def batch(rewards, labels=None, beta: float = 1.0) -> prefzoo.UnpairedBatch:
    r = torch.tensor(rewards, dtype=F64) / beta
    labels = torch.tensor(labels if labels is not None else [i % 2 == 0 for i in range(len(rewards))])
    return prefzoo.UnpairedBatch(policy_logps=(r - 1.0).requires_grad_(), ref_logps=torch.full_like(r, -1.0),
                                 labels=labels)


def with_kl(b: prefzoo.UnpairedBatch) -> prefzoo.UnpairedBatch:
    """``b`` with zero KL-sample log-probs, which kto (the stateless term of the combinations below) needs."""
    z = torch.zeros(b.batch_size, dtype=F64)
    return b.replace(kl_policy_logps=z, kl_ref_logps=z.clone())


def test_stateless_losses_have_no_state():
    loss = prefzoo.get_loss("kto")
    assert not loss.spec.stateful and loss.state is None and loss.state_dict() == {}
    assert prefzoo.loss_spec("bco").stateful


def test_state_advances_on_training_calls_only():
    loss = prefzoo.get_loss("bco", beta=1.0)
    loss(batch([1.0, 3.0]))  # autograd on: a training call
    assert float(loss.state["delta"]) == 2.0
    with torch.no_grad():  # evaluation (the trainer's evaluate runs under no_grad)
        out = loss(batch([10.0, 10.0]))
    assert float(out.metrics["bco/delta"]) == 2.0 and float(loss.state["delta"]) == 2.0
    loss(batch([10.0, 10.0]), update_state=False)  # explicit, whatever the grad mode
    assert float(loss.state["delta"]) == 2.0
    with torch.no_grad():
        loss(batch([6.0, 6.0]), update_state=True)
    assert float(loss.state["delta"]) == 4.0 and float(loss.state["count"]) == 4


def test_state_dict_round_trip_resumes_the_same_deltas():
    a = prefzoo.get_loss("bco", beta=1.0)
    a(batch([1.0, 5.0, -2.0]))
    saved = a.state_dict()
    saved["delta"] += 0  # a copy: changing the loss later does not change what was saved
    b = prefzoo.get_loss("bco", beta=1.0)
    b.load_state_dict(saved)
    nxt = batch([0.5, 0.25])
    torch.testing.assert_close(a(nxt).losses, b(nxt).losses, atol=0, rtol=0)
    torch.testing.assert_close(a.state["delta"], b.state["delta"], atol=0, rtol=0)
    assert float(saved["count"]) == 3  # the saved dict did not move with a


def test_load_state_dict_names_a_bad_key():
    loss = prefzoo.get_loss("bco")
    with pytest.raises(ValueError, match="delta"):
        loss.load_state_dict({"count": torch.zeros((), dtype=F64)})
    with pytest.raises(ValueError, match="'mean'"):
        loss.load_state_dict({**loss.state_dict(), "mean": torch.zeros(())})
    with pytest.raises(ValueError, match=r"kto.*no state"):
        prefzoo.get_loss("kto").load_state_dict({"delta": torch.zeros(())})


def test_checkpoint_saves_and_restores_the_state_as_safetensors(tmp_path):
    pytest.importorskip("accelerate")
    from prefzoo.train.checkpoint import load_loss_state, save_loss_state

    loss = prefzoo.get_loss("bco", beta=1.0)
    loss(batch([2.0, 4.0]))
    save_loss_state(loss, tmp_path)
    loss(batch([100.0, 100.0]))
    load_loss_state(loss, tmp_path)
    assert float(loss.state["delta"]) == 3.0 and float(loss.state["count"]) == 2


def _spec(name: str, fn, initial_state=None) -> prefzoo.LossSpec:
    base = prefzoo.loss_spec("bco")
    return dataclasses.replace(base, name=name, fn=fn, initial_state=initial_state, plugin="test")


def test_output_state_is_checked():
    bco = prefzoo.loss_spec("bco")
    params = bco.params()

    def forgets(b, p, ctx):
        out = bco.fn(b, p, ctx)
        out.state = None
        return out

    def renames(b, p, ctx):
        out = bco.fn(b, p, ctx)
        out.state = {"mean": out.state["delta"], "count": out.state["count"]}
        return out

    def reshapes(b, p, ctx):
        out = bco.fn(b, p, ctx)
        out.state = {**out.state, "delta": out.state["delta"].reshape(1)}
        return out

    for fn, why in ((forgets, "no state"), (renames, "'mean'"), (reshapes, "shape")):
        loss = prefzoo.Loss(_spec("x", fn, bco.initial_state), params)
        with pytest.raises(LossOutputError, match=why) as e:
            loss(batch([1.0, 2.0]))
        assert str(e.value).startswith("loss 'x' (plugin 'test') returned ")  # the loss called is the one named
    def sneaks(b, p, ctx):  # returns a state it never declared
        return bco.fn(b, p, dataclasses.replace(ctx, state=bco.initial_state(p)))

    stateless = prefzoo.Loss(_spec("y", sneaks, None), params)
    with pytest.raises(LossOutputError, match=r"^loss 'y' \(plugin 'test'\) returned a state but declares none"):
        stateless(batch([1.0, 2.0]))


def test_combination_keeps_each_terms_state():
    combo = prefzoo.combine([(1.0, "bco"), (0.5, "kto")])
    assert combo.spec.stateful and set(combo.state) == {"0.delta", "0.count"}
    x = with_kl(batch([1.0, 3.0]))
    out = combo(x)
    alone = prefzoo.get_loss("bco")
    want = alone(batch([1.0, 3.0])).losses + 0.5 * prefzoo.get_loss("kto")(x).losses
    torch.testing.assert_close(out.losses, want, atol=1e-14, rtol=0)
    torch.testing.assert_close(combo.state["0.delta"], alone.state["delta"], atol=0, rtol=0)


def test_a_stateless_term_beside_a_stateful_one_sees_no_state():
    """In a combination that carries state (bco's), a stateless term's context holds None, as when it runs alone:
    a loss that forwards ``ctx.state`` keeps working inside a combination."""
    kto = prefzoo.loss_spec("kto")
    seen = []

    def records(b, p, ctx):
        seen.append(ctx.state)
        return kto.fn(b, p, ctx)

    probe = probe_loss(records, "kto")
    x = with_kl(batch([1.0, 3.0]))
    probe(x)
    prefzoo.combine([(1.0, "bco"), (0.5, probe)])(x)
    assert seen == [None, None]


def test_a_combination_inside_a_combination_keeps_the_inner_terms_state():
    """State keys nest as "<outer term>.<inner term>.<key>": each level strips only its own index."""
    inner = prefzoo.combine([(0.5, "kto"), (1.0, "bco")])
    outer = prefzoo.combine([(1.0, "kto"), (1.0, inner)])
    assert set(outer.state) == {"1.1.delta", "1.1.count"}
    alone = prefzoo.get_loss("bco")
    for rewards in ([1.0, 3.0], [5.0, 2.0, 0.5]):  # the second call must start from the first call's state
        y = with_kl(batch(rewards))
        out = outer(y)
        want = alone(batch(rewards)).losses + 1.5 * prefzoo.get_loss("kto")(y).losses
        torch.testing.assert_close(out.losses, want, atol=1e-14, rtol=0)
    torch.testing.assert_close(outer.state["1.1.delta"], alone.state["delta"], atol=0, rtol=0)
    torch.testing.assert_close(outer.state["1.1.count"], alone.state["count"], atol=0, rtol=0)


def test_running_mean_is_taken_in_float64_from_float32_rewards():
    """2^24 + 3 in float32 sums to 2^24 (the ones are lost): the mean must be taken after the cast, (2^24 + 3)/4."""
    from prefzoo.losses.unpaired import bco_initial_state, running_mean

    state = running_mean(bco_initial_state(None), torch.tensor([2.0**24, 1.0, 1.0, 1.0], dtype=torch.float32))
    assert state["delta"].dtype == F64 and state["delta"].item() == (2**24 + 3) / 4 and state["count"].item() == 4


def test_bco_called_without_its_state_says_how_to_call_it():
    spec = prefzoo.loss_spec("bco")
    ctx = prefzoo.LossContext()
    with pytest.raises(prefzoo.UnpairedBatchError,
                       match=r"^loss 'bco' keeps a running reward mean δ: call it through prefzoo\.Loss \(get_loss\)$"):
        spec.fn(batch([1.0, 2.0]), spec.params(), ctx)
