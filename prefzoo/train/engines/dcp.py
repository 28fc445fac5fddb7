"""Model and optimizer state that resumes on another number of processes or another engine.

Two formats meet here, both keyed by parameter name, never by rank:

- **DCP** (``torch.distributed.checkpoint``): what a sharding engine writes to a shared output dir, ``dcp/`` in the
  checkpoint folder.  Each rank writes its shards; loading reads them into whatever layout the resuming run has
  (another mesh, another number of processes, or whole tensors on every process).
- **accelerate's files** (``model.safetensors`` and ``optimizer.bin``, whole tensors): what accelerate writes for the
  default engine.  A sharding engine loads them by name and shards them (``set_state_dict`` with full state dicts).

torch's state-dict API (``get_state_dict``/``set_state_dict``) turns either side's module and optimizer into
name-keyed dicts, so one loader serves every pair of engines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["DCP_DIR", "has_dcp", "load_accelerate_files", "load_dcp", "save_dcp"]

DCP_DIR = "dcp"


def has_dcp(folder: Path) -> bool:
    """Whether ``folder`` (a checkpoint) holds model and optimizer state in DCP form."""
    return (Path(folder) / DCP_DIR / ".metadata").is_file()


def save_dcp(module: Any, optimizer: Any, folder: Path) -> None:
    """Every rank: its shards of ``module``'s parameters and ``optimizer``'s state into ``folder/dcp`` (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(module, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(Path(folder) / DCP_DIR))


def load_dcp(module: Any, optimizer: Any, folder: Path) -> None:
    """Every rank: ``folder/dcp`` into ``module`` and ``optimizer`` in their current layout (sharded or whole); its
    metadata and non-tensor items are read without full pickle (:mod:`prefzoo.train.checkpoint.state`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from prefzoo.train.checkpoint.state import dcp_planner, dcp_reader

    model_sd, optim_sd = get_state_dict(module, optimizer)  # the layout to fill (optimizer state initialised)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, storage_reader=dcp_reader(Path(folder) / DCP_DIR), planner=dcp_planner())  # no full pickle
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def load_accelerate_files(module: Any, optimizer: Any, folder: Path, trainable_names: list[str]) -> None:
    """accelerate's whole-tensor model and optimizer files into ``module`` and ``optimizer`` of any layout.

    ``trainable_names``: the names of the optimizer's parameters in its order (accelerate saves the optimizer's
    ``state_dict``, keyed by position); parameters tied to another one may be missing from the model file.
    """
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    model: dict[str, Any] = load_file(str(Path(folder) / "model.safetensors"))  # set_state_dict takes Any values
    optimizer_file = Path(folder) / "optimizer.bin"
    saved = torch.load(optimizer_file, weights_only=True)
    groups = [{**group, "params": [trainable_names[i] for i in group["params"]]} for group in saved["param_groups"]]
    state = {trainable_names[i]: s for i, s in saved["state"].items()}
    by_name: dict[str, Any] = {"state": state, "param_groups": groups}
    options = StateDictOptions(full_state_dict=True, strict=False)
    set_state_dict(module, optimizer, model_state_dict=model, optim_state_dict=by_name, options=options)
