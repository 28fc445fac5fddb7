"""No file of a checkpoint runs code when it is read: the loss's state in safetensors, torch data read with
``weights_only=True`` only, and every pickle-capable file checked before the model loads.

A checkpoint folder may come from someone else (a shared run, a download), and pickle runs whatever a file asks
for.  So:

- a stateful loss's state (BCO's running reward mean, a stateful modifier's, a weighted sum's terms'; one flat dict
  of tensors) is ``loss_state.safetensors`` (:func:`save_loss_state`, :func:`load_loss_state`), never accelerate's
  pickled ``custom_checkpoint_N.pkl``;
- accelerate's ``optimizer.bin``, ``scheduler.bin`` and ``random_states_R.pkl`` and an engine's own ``*.pt`` files
  are ``torch.save`` data, read with ``torch.load(weights_only=True)`` and the few plain-data classes of
  :func:`safe_globals`: numpy arrays (the RNG states) and what the engine names
  (:meth:`prefzoo.train.engines.Engine.checkpoint_globals`), whose own loaders are pointed at :func:`safe_torch_load`;
- DCP's ``dcp/.metadata`` is a plain pickle: it is read by an unpickler that builds only DCP's metadata classes,
  sizes, dtypes and paths, its non-tensor items with ``weights_only=True`` (:func:`dcp_reader`, :func:`dcp_planner`);
- :func:`refuse_pickles` runs on every rank once the resume point is chosen and checked, before the model loads: every
  pickle-capable file (:data:`PICKLE_SUFFIXES`) is read the way the run will read it, and one that would need full
  pickle is a :class:`ResumeError` naming it, on every rank.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefzoo.train.checkpoint.save import ResumeError

__all__ = [
    "LOSS_STATE_FILE",
    "PICKLE_SUFFIXES",
    "dcp_planner",
    "dcp_reader",
    "load_loss_state",
    "refuse_pickles",
    "restore_rng",
    "safe_globals",
    "safe_torch_load",
    "save_loss_state",
]

LOSS_STATE_FILE = "loss_state.safetensors"  # a stateful loss's state, written by each checkpoint folder's writer
# files whose format can hold pickled objects: each is read with weights_only=True (or refused) before resuming
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".distcp", ".metadata")


# -- the loss's state ---------------------------------------------------------------------------------------------


def save_loss_state(loss: Any, folder: Path) -> None:
    """A stateful loss's state into ``folder/loss_state.safetensors`` (nothing for a stateless loss)."""
    if loss is None or getattr(loss, "state", None) is None:
        return
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in loss.state_dict().items()}
    save_file(state, str(Path(folder) / LOSS_STATE_FILE))


def load_loss_state(loss: Any, folder: Path) -> None:
    """The state :func:`save_loss_state` wrote, into ``loss``; missing or mismatched state is a ResumeError."""
    if loss is None or getattr(loss, "state", None) is None:
        return
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(folder) / LOSS_STATE_FILE
    if not path.is_file():
        raise ResumeError(
            f"--resume {folder}: loss {loss.name!r} keeps a state between steps, and the checkpoint holds no "
            f"{LOSS_STATE_FILE}; resume from a checkpoint of the same loss written by this prefzoo, or start afresh"
        )
    try:
        loss.load_state_dict(load_file(str(path)))
    except (SafetensorError, OSError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ResumeError(f"--resume {folder}: {path.name} cannot be restored ({first})") from None


# -- reading torch data without running code ----------------------------------------------------------------------


def safe_globals(allowed: Sequence[Any] = ()) -> list[Any]:
    """The plain-data classes a checkpoint's torch files may name beyond torch's own weights-only set: numpy arrays
    (accelerate's RNG states) and ``allowed`` (an engine's records: attributes and numbers, nothing that runs code
    when rebuilt)."""
    from accelerate.utils.other import TORCH_SAFE_GLOBALS

    return [*TORCH_SAFE_GLOBALS, *allowed]


def safe_torch_load(f: Any, map_location: Any = "cpu", mmap: bool = False, allowed: Sequence[Any] = ()) -> Any:
    """``torch.load(f, weights_only=True)`` with :func:`safe_globals`; a file that needs more raises
    ``pickle.UnpicklingError``."""
    import torch

    with torch.serialization.safe_globals(safe_globals(allowed)):
        return torch.load(f, map_location=map_location, weights_only=True, mmap=mmap)


class _MetadataUnpickler(pickle.Unpickler):
    """A pickle reader that builds only DCP's metadata dataclasses, torch sizes, dtypes and layouts, and paths
    (strings and numbers in named fields); any other global (a function to call) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module in _DCP_MODULES and name in _DCP_NAMES:
            return super().find_class(module, name)
        if module == "torch":
            found = getattr(torch, name, None)
            if name == "Size" or isinstance(found, torch.dtype | torch.layout | torch.memory_format):
                return found
        if (module, name) in (("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                              ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath")):  # fmt: skip
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in DCP metadata")


_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_DCP_NAMES = ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
              "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING", "_StorageInfo")  # fmt: skip


def read_dcp_metadata(path: Path) -> Any:
    """``dcp/.metadata`` through :class:`_MetadataUnpickler` (DCP itself reads it with full pickle)."""
    with path.open("rb") as f:
        return _MetadataUnpickler(f).load()


def dcp_reader(folder: Path) -> Any:
    """A DCP storage reader for ``folder`` that reads its metadata without full pickle."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = read_dcp_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return _SafeReader(str(folder))


def dcp_planner() -> Any:
    """DCP's default load planner, reading non-tensor items with ``weights_only=True`` (DCP uses full pickle)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    from prefzoo._thirdparty import dcp_set_element

    class _SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            obj = safe_torch_load(value)
            if self.flatten_state_dict:
                dcp_set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return _SafePlanner()


# -- random state -------------------------------------------------------------------------------------------------


def restore_rng(folder: Path, accelerator: Any, saved_processes: int | None) -> None:
    """This rank's random state (python, numpy, torch CPU) from accelerate's ``random_states_R.pkl``, read with
    ``weights_only=True``; accelerate reads it too, but skips a file it cannot read with an INFO log line and goes on
    with other random state, so here such a file is a ResumeError naming it.  Ranks beyond the checkpoint's
    processes start from the seed (a run resumed on more processes), said once."""
    import random

    import numpy as np
    import torch

    rank, world = accelerator.process_index, accelerator.num_processes
    if saved_processes is not None and world > saved_processes:
        accelerator.print(
            f"prefzoo train: the checkpoint holds the random state of {saved_processes} process(es); processes "
            f"{saved_processes}..{world - 1} start from the seed's, so the resumed run does not repeat bit for bit"
        )
        if rank >= saved_processes:
            return
    path = Path(folder) / f"random_states_{rank}.pkl"
    try:
        states = safe_torch_load(str(path))
        random.setstate(states["random_state"])
        np.random.set_state(states["numpy_random_seed"])
        torch.set_rng_state(states["torch_manual_seed"])
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, OSError, KeyError, TypeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ResumeError(
            f"--resume {folder}: {path.name}, this process's random state, cannot be restored ({type(e).__name__}: "
            f"{first}); without it the run would not repeat: resume from another checkpoint"
        ) from None


# -- the check before anything loads ------------------------------------------------------------------------------


def pickle_files(folder: Path) -> list[Path]:
    """The pickle-capable files of a checkpoint folder (:data:`PICKLE_SUFFIXES`), in a stable order."""
    return sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.name.endswith(PICKLE_SUFFIXES))


def check_file(path: Path, folder: Path, allowed: Sequence[Any] = ()) -> str | None:
    """Why ``path`` cannot be read without full pickle, or None when it can (read the way resuming reads it)."""
    if path.name.startswith("custom_checkpoint_") and path.suffix == ".pkl":
        return (
            "accelerate's pickled custom state, which needs full pickle (prefzoo keeps a loss's state in "
            f"{LOSS_STATE_FILE})"
        )
    try:
        if path.name.endswith(".metadata"):
            read_dcp_metadata(path)
        elif path.suffix == ".distcp":
            _check_distcp(path)
        else:
            _check_torch_file(path, allowed)
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, OSError, KeyError, AttributeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"would need full pickle to load ({type(e).__name__}: {first[:200]})"
    return None


def _check_torch_file(path: Path, allowed: Sequence[Any]) -> None:
    import zipfile

    safe_torch_load(str(path), mmap=zipfile.is_zipfile(path), allowed=allowed)  # zip: tensors mapped, not read


def _check_distcp(path: Path) -> None:
    """Every item of a DCP data file (each a ``torch.save`` blob at an offset the metadata names)."""
    try:
        metadata = read_dcp_metadata(path.parent / ".metadata")
    except (pickle.UnpicklingError, ValueError, EOFError, OSError, AttributeError):
        return  # the metadata is checked (and refused) on its own
    rel = path.name
    with path.open("rb") as f:
        for info in (metadata.storage_data or {}).values():
            if info.relative_path != rel:
                continue
            f.seek(info.offset)
            safe_torch_load(io.BytesIO(f.read(info.length)))


def refuse_pickles(folder: Path, accelerator: Any, node_local: bool, allowed: Sequence[Any] = ()) -> None:
    """Every rank: the checkpoint's pickle-capable files, shared among the ranks that see the same folder, each read
    the way resuming reads it (``allowed``: the engine's plain-data classes); the first that would need full pickle
    is one ResumeError on every rank."""
    files = pickle_files(folder)
    if node_local:
        rank, world = accelerator.local_process_index, _local_world(accelerator)
    else:
        rank, world = accelerator.process_index, accelerator.num_processes
    problem = None
    for path in files[rank::world]:
        why = check_file(path, folder, allowed)
        if why is not None:
            problem = f"{path.relative_to(folder)} {why}"
            break
    problems = _gather(accelerator, problem)
    found = next((p for p in problems if p), None)
    if found:
        raise ResumeError(
            f"--resume {folder}: {found}; prefzoo reads checkpoints only as safetensors, JSON and "
            "torch.load(weights_only=True) data and refuses this file: resume from a checkpoint you trust"
        )


def _local_world(accelerator: Any) -> int:
    from prefzoo._dist import local_world_size

    return local_world_size(accelerator.num_processes)


def _gather(accelerator: Any, obj: Any) -> list[Any]:
    if accelerator.num_processes == 1:
        return [obj]
    from accelerate.utils import gather_object

    return list(gather_object([obj]))
