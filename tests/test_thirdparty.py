"""The private names of other libraries prefzoo relies on (prefzoo/_thirdparty.py) still exist and behave as relied on.

Each test reads the library itself, so an upgrade that renames or changes one fails here, naming it, instead of
inside a run.  Runs in tox's train env (accelerate, transformers, datasets, deepspeed installed).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from prefzoo import _thirdparty as tp


@pytest.fixture
def accelerator():
    from accelerate import Accelerator

    tp.reset_accelerate_state()
    yield Accelerator(cpu=True)
    tp.reset_accelerate_state()


def test_reset_accelerate_state_lets_the_next_accelerator_take_its_own_settings():
    from accelerate import Accelerator

    tp.reset_accelerate_state()
    assert Accelerator(cpu=True, gradient_accumulation_steps=3).gradient_accumulation_steps == 3
    tp.reset_accelerate_state()
    assert Accelerator(cpu=True, gradient_accumulation_steps=1).gradient_accumulation_steps == 1
    tp.reset_accelerate_state()


def test_prepared_models_are_what_prepare_wrapped(accelerator):
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    assert tp.prepared_models(accelerator) == [model]


def test_load_state_without_models_skips_model_and_optimizer_files_and_puts_the_lists_back(accelerator, tmp_path):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    model, optimizer, schedule = accelerator.prepare(model, optimizer, schedule)
    accelerator.save_state(str(tmp_path))
    for f in tmp_path.iterdir():  # what a sharded (DCP) checkpoint keeps out of accelerate's files
        if f.name.startswith(("model", "optimizer")):
            f.unlink()
    with pytest.raises(Exception):  # noqa: B017 - whichever error accelerate raises for the missing files
        accelerator.load_state(str(tmp_path))
    optimizer.step()
    schedule.step()
    with tp.loading_state_without_models(accelerator):
        accelerator.load_state(str(tmp_path))
    assert schedule.state_dict()["last_epoch"] == 0  # the schedule came back from the files
    assert tp.prepared_models(accelerator) == [model] and accelerator._optimizers == [optimizer]


def test_deepspeed_builds_its_shm_op_through_the_module_function_prefzoo_replaces(monkeypatch):
    comm = pytest.importorskip("deepspeed.comm.torch")
    assert callable(comm.build_shm_op)
    assert "build_shm_op()" in inspect.getsource(comm.TorchBackend)  # looked up in the module at each call
    monkeypatch.setattr(comm, "build_shm_op", comm.build_shm_op)  # undone after the test
    tp.skip_deepspeed_shm_build()
    assert comm.build_shm_op() is None


def test_dcp_set_element_is_what_dcps_load_planner_uses():
    from torch.distributed.checkpoint import DefaultLoadPlanner

    assert "set_element(" in inspect.getsource(DefaultLoadPlanner)
    root: dict = {"a": {"b": [1, 2]}}
    tp.dcp_set_element(root, ("a", "b", 1), 5)
    assert root == {"a": {"b": [1, 5]}}


def _tiny_llama(attn: str = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2)  # fmt: skip
    return LlamaForCausalLM._from_config(cfg, attn_implementation=attn)


def test_attn_implementation_is_what_the_layers_dispatch_on():
    from transformers.models.llama import modeling_llama

    assert "self.config._attn_implementation" in inspect.getsource(modeling_llama.LlamaAttention.forward)
    model = _tiny_llama("eager")
    assert tp.attn_implementation(model.config) == "eager"
    assert tp.attn_implementation(object(), "sdpa") == "sdpa"
    with tp.using_attn_implementation(model.config, "sdpa"):
        assert tp.attn_implementation(model.config) == "sdpa"
    assert tp.attn_implementation(model.config) == "eager"


def test_no_split_modules_and_sdpa_support_are_declared_by_the_model_class():
    model = _tiny_llama()
    assert tp.no_split_modules(model) == ["LlamaDecoderLayer"]
    assert tp.no_split_modules(torch.nn.Linear(1, 1)) == []
    assert tp.supports_sdpa(model) and not tp.supports_sdpa(torch.nn.Linear(1, 1))


def test_a_datasets_fingerprint_names_its_contents_and_transforms():
    from datasets import Dataset

    ds = Dataset.from_dict({"a": [1, 2]})
    mapped = ds.map(lambda r: {"a": r["a"] + 1})
    assert isinstance(tp.dataset_fingerprint(ds), str) and tp.dataset_fingerprint(ds) != tp.dataset_fingerprint(mapped)
    assert tp.dataset_fingerprint(Dataset.from_dict({"a": [1, 2]})) == tp.dataset_fingerprint(ds)
    assert tp.dataset_fingerprint([1, 2]) is None


def test_saved_tensor_hooks_active_sees_torchs_hooks():
    assert "_top_saved_tensors_default_hooks" in dir(torch._C._autograd)
    assert not tp.saved_tensor_hooks_active()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert tp.saved_tensor_hooks_active()
    assert not tp.saved_tensor_hooks_active()


def test_default_store_is_the_process_groups_store(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        store = tp.default_store()
        store.set("prefzoo/probe", "1")
        assert store.check(["prefzoo/probe"]) and store.get("prefzoo/probe") == b"1"
    finally:
        dist.destroy_process_group()
