"""DeepSpeed ZeRO-2/3 (``--deepspeed zero2|zero3|FILE.json``) through accelerate's DeepSpeed plugin.

accelerate wraps the policy in DeepSpeed's engine, which partitions optimizer states (ZeRO-2) and parameters
(ZeRO-3) and steps inside ``backward`` at the accumulation boundary.  Without a GPU it runs on DeepSpeed's CPU
accelerator over gloo.  Under ZeRO-3 a frozen reference is a second load of the starting model partitioned like the
policy (not a copy of the policy), and nothing is generated from the partitioned weights.

Non-finite steps: with one micro-batch per step no process calls backward for a bad step, so the engine never steps.
With several, earlier micro-batches' gradients are already in the engine, which has no API to drop them; so the rest
of the step backpropagates NaN and the engine's own overflow check (:meth:`DeepSpeedEngine.drops_nonfinite_steps`)
drops the step at the boundary, or, where it would not, the run stops with a message.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, cast

import torch

from prefzoo._thirdparty import one_process_group_env, prepared_models, skip_deepspeed_shm_build
from prefzoo.errors import ConfigError, install_hint
from prefzoo.train.engines.base import Engine, EngineSettings

__all__ = ["DeepSpeedEngine", "DeepSpeedMissingError", "deepspeed_config", "end_zero3_switch", "read_with_weights_only"]


class DeepSpeedMissingError(RuntimeError):
    """``--deepspeed`` was given but deepspeed is not importable."""


class DeepSpeedEngine(Engine):
    """``--deepspeed``: ZeRO-2 or ZeRO-3 (a preset name or a user's JSON config)."""

    steps_in_backward = True
    fast_paths_measured = False

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)
        self.stage = _stage(cast(str, settings.deepspeed))
        self.label = f"DeepSpeed ZeRO-{self.stage}"  # type: ignore[misc]
        self.partitions_params = self.stage == 3  # type: ignore[misc]
        self.self_check = self.stage != 3  # type: ignore[misc]
        if self.stage == 3:
            self.unsupported = {  # type: ignore[misc]
                "merge_lora": "merging LoRA into ZeRO-3 partitioned weights is not supported here; save the adapter "
                "and merge afterwards",
                "density_ratio": "the partitioned reference is not wired for prompt embeddings yet; use zero2 or "
                "drop --density-ratio",
            }

    @property
    def option(self) -> str:
        return f"--deepspeed {self.cfg.deepspeed}"

    @property
    def checkpoint_format(self) -> str:
        """DeepSpeed's own partitioned files: they resume on the same stage and number of processes."""
        return "deepspeed"

    def accelerator_kwargs(self, no_gpu: bool, timeout: Any) -> dict[str, Any]:
        from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

        try:
            import deepspeed  # noqa: F401
        except ImportError:
            raise DeepSpeedMissingError(f"{self.option} needs deepspeed: {install_hint('deepspeed')}") from None
        kwargs: dict[str, Any] = {}
        if no_gpu:
            _prepare_deepspeed_on_cpu()
            kwargs["kwargs_handlers"] = [InitProcessGroupKwargs(backend="gloo", timeout=timeout)]
        cfg = self.cfg
        ds_cfg = deepspeed_config(
            cast(str, cfg.deepspeed), cfg.per_device_batch_size, cfg.grad_accum, cfg.max_grad_norm, cfg.mixed_precision
        )
        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=ds_cfg, zero3_init_flag=False)
        return kwargs

    def use_node_local_storage(self, accelerator: Any) -> None:
        """DeepSpeed's own switch: model states on every node, not rank 0 only."""
        ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
        ds_config.setdefault("checkpoint", {})["use_node_local_storage"] = True

    def frozen_reference(self, policy: Any, accelerator: Any) -> tuple[Any, str]:
        """ZeRO-3: a second load of the starting model, partitioned like the policy (not copied from it)."""
        if self.stage != 3:
            return super().frozen_reference(policy, accelerator)
        import deepspeed

        from prefzoo.model import PolicyLogps, load_model_and_tokenizer
        from prefzoo.scoring import FrozenReference

        cfg = self.cfg
        ref_lm, _, _ = load_model_and_tokenizer(cast(str, cfg.model), trust_remote_code=cfg.trust_remote_code)
        ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
        ds_cfg = {k: v for k, v in copy.deepcopy(ds_config).items() if k not in ("optimizer", "scheduler")}
        module = PolicyLogps(ref_lm, cfg.logp_chunk_size, packing=policy.packing)
        module.requires_grad_(False)
        wrapped, *_ = deepspeed.initialize(model=module, config=ds_cfg)
        wrapped.eval()
        return FrozenReference.around(wrapped), "frozen ZeRO-3 partitioned copy of the starting model"

    def checkpoint_globals(self) -> list[Any]:
        """What ZeRO's optimizer files name besides tensors: its loss-scaler settings, the ZeRO stage (an enum) and
        fragment offsets (a record of two numbers)."""
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]

    def load_state(self, accelerator: Any, policy: Any, optimizer: Any, folder: Path) -> None:
        """accelerate's state, DeepSpeed's files read with ``torch.load(weights_only=True)`` (DeepSpeed's own
        checkpoint engine would unpickle them in full)."""
        for model in prepared_models(accelerator):
            read_with_weights_only(model, self.checkpoint_globals())
        super().load_state(accelerator, policy, optimizer, folder)

    def drops_nonfinite_steps(self, wrapped: Any) -> bool:
        """Whether ZeRO's optimizer drops a step whose gradient norm is inf/NaN by itself (gradients zeroed,
        weights, moments and its step count untouched, ``wrapped.was_step_applied()`` False).

        ZeRO-3 always checks the norm; ZeRO-1/2 check it when it is computed, except in bf16 unless the config sets
        ``bf16.check_grad_overflow``.  Without ZeRO the torch optimizer steps whatever it gets.
        """
        stage_of = getattr(wrapped, "zero_optimization_stage", None)
        stage = stage_of() if callable(stage_of) else 0
        opt = getattr(wrapped, "optimizer", None)
        if stage == 3:
            return True
        if stage in (1, 2):
            checks = bool(getattr(opt, "check_grad_overflow", False)) or getattr(opt, "dtype", None) != torch.bfloat16
            return bool(getattr(opt, "compute_grad_norm", False)) and checks
        return False

    def nonfinite_advice(self) -> str:
        return (
            "under DeepSpeed the engine steps inside backward, and this engine does not drop a step with NaN "
            "gradients (no ZeRO, or bf16 without bf16.check_grad_overflow), so with --grad-accum > 1 prefzoo stops "
            "instead (with --grad-accum 1 it skips it)"
        )

    def end(self, accelerator: Any) -> None:
        end_zero3_switch()


def read_with_weights_only(wrapped: Any, allowed: list[Any]) -> None:
    """Point a DeepSpeed engine's checkpoint reads at ``torch.load(weights_only=True)`` with ``allowed``
    (:func:`prefzoo.train.checkpoint.state.safe_torch_load`); its own checkpoint engine's ``load`` uses full pickle.
    Saving is unchanged."""
    from prefzoo.train.checkpoint.state import safe_torch_load

    reader = getattr(wrapped, "checkpoint_engine", None)
    if reader is not None:
        reader.load = lambda path, map_location=None: safe_torch_load(path, map_location=map_location, allowed=allowed)


def end_zero3_switch() -> None:
    """Turn off transformers' process-wide ZeRO-3 switch that accelerate turned on when the run began.  Left on,
    every later ``from_pretrained`` in the process (the default task scoring ``final/``, a user's own load) would
    partition the model with ``zero.Init`` and wait forever for a process group that is gone."""
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()


def _stage(spec: str) -> int:
    """The ZeRO stage of ``zero2``, ``zero3`` or a JSON config (0 when it sets none)."""
    if spec in ("zero2", "zero3"):
        return int(spec[-1])
    zero = _user_deepspeed_config(spec).get("zero_optimization") or {}
    return int(zero.get("stage", 0))


def deepspeed_config(
    spec: str, per_device_batch_size: int, grad_accum: int, max_grad_norm: float, mixed_precision: str
) -> dict[str, Any]:
    """A DeepSpeed config dict from ``zero2``, ``zero3`` or a JSON file path (its batch keys filled in)."""
    if spec in ("zero2", "zero3"):
        cfg: dict[str, Any] = {
            "zero_optimization": {"stage": int(spec[-1]), "overlap_comm": False, "contiguous_gradients": True},
            "zero_allow_untested_optimizer": True,  # the optimizer is ours (torch AdamW or bitsandbytes AdamW8bit)
        }
        if spec == "zero3":
            cfg["zero_optimization"].update({"stage3_gather_16bit_weights_on_model_save": True})
    else:
        cfg = _user_deepspeed_config(spec)
    cfg["train_micro_batch_size_per_gpu"] = per_device_batch_size
    cfg["gradient_accumulation_steps"] = grad_accum
    cfg.setdefault("gradient_clipping", max_grad_norm)
    cfg.setdefault("steps_per_print", 10**9)
    cfg.setdefault("bf16", {"enabled": mixed_precision == "bf16"})
    cfg.setdefault("fp16", {"enabled": mixed_precision == "fp16"})
    cfg.pop("train_batch_size", None)
    return cfg


def _user_deepspeed_config(spec: str) -> dict[str, Any]:
    """A user's DeepSpeed JSON, checked before anything loads: ZeRO-3 must gather 16-bit weights on save, since the
    final model is written with ``save_pretrained`` from gathered weights (without it the run trains, then fails)."""
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"--deepspeed {spec}: choose zero2, zero3 or an existing JSON config file")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"--deepspeed {spec}: not valid JSON ({e.msg} at line {e.lineno}); fix the file") from None
    zero = cfg.get("zero_optimization") if isinstance(cfg, dict) else None
    if not isinstance(cfg, dict) or not isinstance(zero or {}, dict):
        raise ConfigError(f"--deepspeed {spec}: expected a JSON object with a 'zero_optimization' object")
    if zero and zero.get("stage") == 3:
        key = "stage3_gather_16bit_weights_on_model_save"
        if zero.get(key) is False:
            raise ConfigError(
                f"--deepspeed {spec}: zero_optimization.{key} is false, so the final model could not be saved after "
                "training; set it to true (or remove it: prefzoo sets it)"
            )
        zero[key] = True  # absent: what the zero3 preset sets; the final save needs it
    return cfg


def _prepare_deepspeed_on_cpu() -> None:
    """DeepSpeed without a GPU: CPU accelerator, skip the JIT shared-memory op build, single-process env vars."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    skip_deepspeed_shm_build()  # identical results, no 40 s build
    one_process_group_env()  # plain `python`, not a launcher: a one-process group
