"""Building the Accelerator (prefzoo/train/engines/accelerator.py): the run's settings reach accelerate, DeepSpeed on
CPU gets its one-process environment, and settings accelerate would ignore or cannot honour are one line each."""

from __future__ import annotations

import dataclasses
import socket
import sys
import types
from pathlib import Path

import pytest

from prefzoo.train.config import ConfigError, TrainConfig
from prefzoo.train.engines import EngineSettings, build_accelerator, engine_for
from prefzoo.train.engines import accelerator as distributed
from prefzoo.train.engines import deepspeed as ds_engine
from prefzoo.train.engines.deepspeed import DeepSpeedMissingError, deepspeed_config

RUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR")


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """accelerate's state is process-wide: leave none of these tests' settings to the tests after them."""
    yield
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _clear(monkeypatch) -> None:
    """Unset the launcher's variables, and have monkeypatch remove whatever the code under test sets afterwards
    (``delenv`` of an absent variable records nothing to undo, so each is set first)."""
    for k in RUN_ENV:
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)


def _cfg(**kw) -> EngineSettings:
    return EngineSettings.of(dataclasses.replace(TrainConfig(), cpu=True, **kw))


def test_the_engines_read_only_their_share_of_the_run_config():
    """An engine keeps the EngineSettings of a TrainConfig, each field as the run set it (and no other field)."""
    cfg = dataclasses.replace(TrainConfig(), cpu=True, deepspeed="zero2", grad_accum=3, seed=7, logp_chunk_size=64,
                              merge_lora=True, dist_timeout=5.0)  # fmt: skip
    settings = EngineSettings.of(cfg)
    for f in dataclasses.fields(EngineSettings):
        assert getattr(settings, f.name) == getattr(cfg, f.name), f.name
    assert EngineSettings.of(settings) is settings
    engine = engine_for(settings)
    assert engine.cfg is settings and not isinstance(engine.cfg, TrainConfig)


def test_the_runs_settings_reach_the_accelerator(tmp_path, monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    acc = build_accelerator(_cfg(grad_accum=3, seed=11, dist_timeout=77.0), None, str(tmp_path))
    assert acc.gradient_accumulation_steps == 3 and acc.mixed_precision == "no"
    assert acc.device.type == "cpu" and acc.state.deepspeed_plugin is None
    assert acc.dataloader_config.use_seedable_sampler and acc.dataloader_config.data_seed == 11
    assert acc.step_scheduler_with_optimizer is False  # the loop steps the schedule once per optimizer step
    assert acc.init_handler.timeout.total_seconds() == 77.0
    assert Path(acc.project_dir) == tmp_path and Path(acc.logging_dir) == tmp_path / "tb"
    # a second run in the same interpreter (a notebook, these tests) with other settings starts afresh
    again = build_accelerator(_cfg(grad_accum=1, mixed_precision="bf16"), None, str(tmp_path))
    assert again.gradient_accumulation_steps == 1 and again.mixed_precision == "bf16"


def test_deepspeed_missing_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # importing it raises ImportError
    with pytest.raises(DeepSpeedMissingError) as e:
        build_accelerator(_cfg(deepspeed="zero2"), None, str(tmp_path))
    assert str(e.value) == ("--deepspeed zero2 needs deepspeed: pip install -e \".[deepspeed]\" from the prefzoo "
                            "clone, or pip install 'prefzoo[deepspeed]'")


def test_a_missing_deepspeed_file_names_the_presets(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        deepspeed_config(str(tmp_path / "nope.json"), 1, 1, 1.0, "no")
    assert str(e.value) == f"--deepspeed {tmp_path / 'nope.json'}: choose zero2, zero3 or an existing JSON config file"


def test_deepspeed_on_cpu_gets_a_one_process_group_and_skips_the_shm_build(monkeypatch):
    _clear(monkeypatch)
    comm = types.ModuleType("deepspeed.comm.torch")
    comm.build_shm_op = lambda: pytest.fail("the shared-memory op would be built")
    monkeypatch.setitem(sys.modules, "deepspeed.comm.torch", comm)
    ds_engine._prepare_deepspeed_on_cpu()
    import os

    assert comm.build_shm_op() is None
    env = {k: os.environ[k] for k in RUN_ENV}
    port = int(env.pop("MASTER_PORT"))
    assert env == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                   "MASTER_ADDR": "127.0.0.1", "DS_ACCELERATOR": "cpu"}  # fmt: skip
    assert 0 < port < 65536
    with socket.socket() as s:  # the port was free (and is again)
        s.bind(("127.0.0.1", port))


def test_under_a_launcher_the_environment_is_left_as_it_is(monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    monkeypatch.setitem(sys.modules, "deepspeed.comm.torch", None)  # a DeepSpeed without the op: nothing to skip
    ds_engine._prepare_deepspeed_on_cpu()
    import os

    assert os.environ["RANK"] == "3" and os.environ["DS_ACCELERATOR"] == "cuda" and "WORLD_SIZE" not in os.environ


@pytest.mark.parametrize(
    ("flag", "deepspeed", "no_gpu", "message"),
    [
        ("true", "zero2", False, "accelerate launch --use_fsdp together with --deepspeed zero2: choose one sharding "
                                 "engine (drop --use_fsdp, or drop --deepspeed)"),
        ("1", None, True, "accelerate launch --use_fsdp (ACCELERATE_USE_FSDP=true): without a GPU accelerate ignores "
                          "FSDP and would run plain DDP, every process holding the whole model; drop --use_fsdp to "
                          "train with DDP, or shard on CPU with prefzoo's own FSDP2 engine (--fsdp) or --deepspeed "
                          "zero3"),
        ("YES", None, True, "accelerate launch --use_fsdp (ACCELERATE_USE_FSDP=true): without a GPU accelerate ignores "
                            "FSDP and would run plain DDP, every process holding the whole model; drop --use_fsdp to "
                            "train with DDP, or shard on CPU with prefzoo's own FSDP2 engine (--fsdp) or --deepspeed "
                            "zero3"),
        ("true", None, False, None),  # with a GPU accelerate runs its FSDP
        ("false", "zero2", True, None),
        (None, "zero2", True, None),
    ],
)  # fmt: skip
def test_accelerates_own_fsdp_flag_is_refused_where_it_would_be_ignored(monkeypatch, flag, deepspeed, no_gpu, message):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    if flag is not None:
        monkeypatch.setenv("ACCELERATE_USE_FSDP", flag)
    if message is None:
        distributed._refuse_ignored_fsdp(deepspeed, no_gpu)
        return
    with pytest.raises(ConfigError) as e:
        distributed._refuse_ignored_fsdp(deepspeed, no_gpu)
    assert str(e.value) == message


def test_no_gpu_means_cpu_asked_for_or_no_cuda(tmp_path, monkeypatch):
    """--use_fsdp is refused without a GPU: with --cpu on any machine, and without --cpu where CUDA is absent."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    refusal = r"^accelerate launch --use_fsdp \(ACCELERATE_USE_FSDP=true\): without a GPU"
    for cpu, cuda in ((True, True), (False, False)):
        monkeypatch.setattr(distributed.torch.cuda, "is_available", lambda cuda=cuda: cuda)
        with pytest.raises(ConfigError, match=refusal):
            build_accelerator(EngineSettings.of(dataclasses.replace(TrainConfig(), cpu=cpu)), None, str(tmp_path))


def test_engine_settings_default_to_the_run_configs_defaults():
    """EngineSettings repeats the defaults of the TrainConfig keys it holds: they must not drift apart."""
    run = TrainConfig()
    mine = EngineSettings()
    assert {f.name: getattr(mine, f.name) for f in dataclasses.fields(EngineSettings)} == {
        f.name: getattr(run, f.name) for f in dataclasses.fields(EngineSettings)
    }
