"""Several machines: whose disk each node writes to, and what every rank must agree on before it starts or resumes.

* Storage.  Global rank 0 writes a random token into ``output_dir/.prefzoo-node-marker``; the first process of each
  node (local rank 0) reads it back.  If every node sees it the output dir is *shared* (one filesystem: rank 0 writes
  the checkpoints' shared files, as on one machine); if only node 0 does, it is *node-local* (each node's local rank
  0 writes a complete checkpoint, the model and optimizer state its ranks need, into its own disk); a mix is refused.
* Resume.  Each rank reports the complete checkpoint steps that hold its own RNG state; the newest step held by
  every rank is resumed (or, for ``--resume PATH``, every rank must hold PATH).  When none is common every rank stops
  at once with one line naming the node, the step it lacks and the fix, instead of waiting on the others' collectives
  until ``--dist-timeout``.
* Identity.  The tokenized data's content digest, the loss and its parameters, the model identity and the
  precomputed-reference cache key are compared across ranks at start; a difference names both values.
* A lost peer.  After a failed collective, the surviving ranks check in through the launcher's key-value store and
  the ones that never do are named.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from prefzoo._dist import local_world_size
from prefzoo._safefs import write_text_nofollow
from prefzoo.train.checkpoint.save import (
    COMPLETE_MARKER,
    ResumeError,
    complete_checkpoints,
    is_complete,
    read_marker,
    verify_checkpoint,
)
from prefzoo.train.config import ConfigError

__all__ = [
    "NODE_MARKER",
    "Storage",
    "agree_on_resume",
    "agree_on_values",
    "content_digest",
    "detect_storage",
    "lost_ranks",
]

NODE_MARKER = ".prefzoo-node-marker"  # rewritten by rank 0 at every start; read by each node's local rank 0


def _node_rank(process_index: int) -> int:
    """This process's node: the launcher's GROUP_RANK (torchrun, accelerate launch), else rank // local world."""
    if os.environ.get("GROUP_RANK"):
        return int(os.environ["GROUP_RANK"])
    return process_index // max(1, local_world_size())


@dataclass(frozen=True)
class Storage:
    """Where this run's output dir lives, as seen from this process."""

    shared: bool  # one folder every node sees (True on one machine)
    nodes: int  # machines in the run
    node: int  # this process's node rank
    host: str
    writer: bool  # this process writes its node's checkpoint folders (global rank 0 if shared, else local rank 0)

    def where(self) -> str:
        return f"node {self.node} ({self.host})"


def _gather(accelerator: Any, obj: Any) -> list[Any]:
    """``obj`` from every rank, in rank order (one object per rank)."""
    if accelerator.num_processes == 1:
        return [obj]
    from accelerate.utils import gather_object

    return list(gather_object([obj]))


def _broadcast(accelerator: Any, obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if accelerator.num_processes == 1:
        return obj
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([obj])[0]


def detect_storage(accelerator: Any, output_dir: str | Path) -> Storage:
    """Whether ``output_dir`` is shared by every node or local to each (one collective round; printed by rank 0)."""
    host = socket.gethostname()
    node = _node_rank(accelerator.process_index)
    if accelerator.num_processes == 1:
        return Storage(shared=True, nodes=1, node=0, host=host, writer=True)
    out = Path(output_dir)
    token = uuid.uuid4().hex if accelerator.is_main_process else None
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_text_nofollow(out / NODE_MARKER, str(token))
    token = _broadcast(accelerator, token)  # after rank 0 wrote it
    seen = None
    if accelerator.is_local_main_process:
        try:
            seen = (out / NODE_MARKER).read_text().strip() == token
        except OSError:
            seen = False
    views = _gather(accelerator, (node, host, seen))  # (node, host, sees rank 0's marker or None) per rank
    others = {n: s for n, _, s in views if s is not None and n != views[0][0]}  # nodes other than rank 0's
    nodes = len({n for n, _, _ in views})
    if all(others.values()):
        shared = True  # also with one node
    elif not any(others.values()):
        shared = False
    else:
        mixed = sorted(n for n, s in others.items() if s)
        raise ConfigError(
            f"--output-dir {out}: nodes {mixed} share it with rank 0 and the others do not; give every node either "
            "the same shared folder or each its own local folder"
        )
    writer = accelerator.is_main_process if shared else accelerator.is_local_main_process
    storage = Storage(shared=shared, nodes=nodes, node=node, host=host, writer=writer)
    kind = "shared by every node" if shared else "node-local (each node writes the checkpoints its ranks resume from)"
    accelerator.print(f"prefzoo train: {accelerator.num_processes} processes on {nodes} node(s); --output-dir {kind}")
    return storage


# -- resume ------------------------------------------------------------------------------------------------------


def _holds(path: Path, process_index: int) -> bool:
    """``path`` is a complete checkpoint holding this rank's RNG state (every rank writes its own), or one written by
    fewer processes than this rank's index (a run resumed on more processes: the new ranks start from the seed)."""
    if not is_complete(path):
        return False
    try:
        marker = read_marker(path)
    except ValueError:
        return False
    files, batch = marker.get("files"), marker.get("batch")
    written_by = batch[0] if isinstance(batch, list) and batch and isinstance(batch[0], int) else None
    if written_by is not None and process_index >= written_by:
        return True
    return not isinstance(files, dict) or f"random_states_{process_index}.pkl" in files


def _marker_step(path: Path) -> int | None:
    """The step a checkpoint's completion marker records, or None where the marker is unreadable."""
    try:
        return int(read_marker(path)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def agree_on_resume(accelerator: Any, storage: Storage, output_dir: str | Path, resume: str | None) -> Path | None:
    """The checkpoint this rank resumes from (the same step on every rank), or None for a fresh start.

    ``resume``: None (no resume), 'auto' (the newest step every rank holds whose files verify) or a checkpoint path
    every rank must hold.  Raises :class:`ResumeError` on every rank, with the same message, when the ranks cannot
    agree, when the checkpoint asked for fails verification, or when checkpoints exist and none verifies.
    """
    if not resume:
        return None
    rank = accelerator.process_index
    if resume == "auto":
        mine = {int(p.name.split("-")[1]): p for p in complete_checkpoints(output_dir) if _holds(p, rank)}
    else:
        path = Path(resume)
        step = _marker_step(path) if path.is_dir() and _holds(path, rank) else None
        mine = {step: path} if step is not None else {}
    held = sorted(mine)
    views = _gather(accelerator, (rank, storage.where(), str(output_dir), held))
    if accelerator.num_processes == 1:
        if resume != "auto":
            read_marker(resume)  # the single-process message: missing, incomplete or corrupt
            return _newest_verified(accelerator, storage, output_dir, resume, [0], {0: Path(resume)})
        return _newest_verified(accelerator, storage, output_dir, resume, held, mine)
    common = set(views[0][3]).intersection(*(set(v[3]) for v in views[1:]))
    if resume != "auto":
        lacking = [v for v in views if not v[3]]
        if lacking:
            r, where, _, _ = lacking[0]
            raise ResumeError(
                f"--resume {resume}: rank {r} on {where} has no complete checkpoint there (with its RNG state "
                f"random_states_{r}.pkl and {COMPLETE_MARKER}); every rank must resume from the same checkpoint: "
                "copy that folder to the same path on that node, or use an --output-dir every node shares"
            )
        return _newest_verified(accelerator, storage, output_dir, resume, held, mine)
    anywhere = sorted(set().union(*(set(v[3]) for v in views)))
    if anywhere and not common:
        newest = anywhere[-1]
        holder = next(v for v in views if newest in v[3])
        r, where, out, _ = next(v for v in views if newest not in v[3])
        raise ResumeError(
            f"--resume auto: rank {r} on {where} holds no complete checkpoint step-{newest:08d} in {out}/checkpoints "
            f"(rank {holder[0]} on {holder[1]} does), and no step is held by every rank; ranks must resume from the "
            f"same step: use an --output-dir shared by every node, or copy checkpoints/step-{newest:08d} from "
            f"{holder[1]} to {out}/checkpoints on {where}, or start afresh with a new --output-dir"
        )
    if common and max(common) < anywhere[-1]:
        accelerator.print(
            f"prefzoo train: the newest step every rank holds is {max(common)} (step {anywhere[-1]} is missing "
            "on some node)"
        )
    return _newest_verified(accelerator, storage, output_dir, resume, sorted(common), mine)


def _newest_verified(
    accelerator: Any, storage: Storage, output_dir: str | Path, resume: str, steps: list[int], mine: dict[int, Path]
) -> Path | None:
    """The newest of ``steps`` (held by every rank) whose files verify on every node, said when newer ones do not.

    Each node's writer hashes its node's folder (a shared folder once, node-local ones each on their node) and every
    rank learns the verdicts, so all resume the same step.  None: nothing to resume (a fresh start), only when no
    checkpoint is damaged; checkpoints that exist and fail are refused rather than trained over.
    """
    failed: list[str] = []
    for step in reversed(steps):
        verdict = verify_checkpoint(mine[step]) if storage.writer else None
        node = f" on {storage.where()}" if accelerator.num_processes > 1 else ""
        whys = [w for w in _gather(accelerator, verdict.why + node if verdict and not verdict.ok else "") if w]
        if not whys:
            _say_verified(accelerator, verdict, mine[step], failed)
            return mine[step]
        failed.append(f"{mine[step].name}: {whys[0]}")
        if resume != "auto":
            raise ResumeError(
                f"--resume {resume}: the checkpoint fails verification ({whys[0]}); its files are not the ones "
                "written at that step, so it is not loaded. Resume from another checkpoint (--resume auto picks the "
                "newest one that verifies)"
            )
    root = Path(output_dir) / "checkpoints"
    folders = sorted(root.glob("step-*")) if storage.writer and root.is_dir() else []
    damaged = [p.name for p in folders if p.is_dir() and not is_complete(p)]  # complete ones were verified above
    damaged = sorted(set().union(*(set(d) for d in _gather(accelerator, damaged))))
    if failed or damaged:
        why = "; ".join(failed) or f"{', '.join(damaged)}: incomplete (a file the marker lists is missing or truncated)"
        raise ResumeError(
            f"--resume auto: no checkpoint in {root} verifies ({why}), so nothing is resumed and nothing in "
            f"{output_dir} is overwritten; move the damaged step-* folders out of {root} to start afresh there, or "
            "use a new --output-dir"
        )
    return None


def _say_verified(accelerator: Any, verdict: Any, path: Path, failed: list[str]) -> None:
    """One line when newer checkpoints failed (which, why) or when ``path``'s marker records no sha256."""
    if failed:
        accelerator.print(
            f"prefzoo train: --resume auto: skipping {'; '.join(failed)}; resuming from {path.name}, the newest "
            "checkpoint that verifies"
        )
    if verdict is not None and not verdict.hashed:
        accelerator.print(
            f"prefzoo train: warning: {path}'s {COMPLETE_MARKER} records no sha256 (written by an older prefzoo), "
            "so its files are checked by size only, not verified; the next checkpoint this run saves is verified"
        )


# -- what must be identical ------------------------------------------------------------------------------------


def content_digest(dataset: Any) -> str:
    """sha256 (first 16 hex digits) of a datasets.Dataset's rows in order, whatever file or cache they came from."""
    import pyarrow as pa

    h = hashlib.sha256()
    for table in dataset.with_format("arrow").iter(batch_size=4096):
        table = table.replace_schema_metadata(None)  # datasets' metadata holds its path-dependent fingerprint
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.combine_chunks())
        h.update(sink.getvalue().to_pybytes())
    return h.hexdigest()[:16]


def agree_on_values(
    accelerator: Any, storage: Storage, values: dict[str, str], hints: dict[str, str], notes: dict[str, str]
) -> None:
    """Stop every rank with one line when a value of ``values`` differs between ranks.

    ``hints[name]``: the fix; ``notes[name]``: shown beside this rank's value (e.g. its --dataset), not compared.
    """
    if accelerator.num_processes == 1:
        return
    views = _gather(accelerator, (accelerator.process_index, storage.where(), values, notes))
    r0, where0, first, notes0 = views[0]
    for name, value in first.items():
        for r, where, vals, nts in views[1:]:
            if vals.get(name) != value:
                raise ConfigError(
                    f"ranks disagree on the {name}: rank {r0} on {where0} has {value}{notes0.get(name, '')}, rank {r} "
                    f"on {where} has {vals.get(name)}{nts.get(name, '')}; {hints.get(name, 'use the same settings')}"
                )


# -- a lost peer ---------------------------------------------------------------------------------------------------


def lost_ranks(wait_s: float) -> list[int] | None:
    """After a failed collective: the ranks that do not check in within ``wait_s`` s (None when that cannot be known).

    Every surviving rank writes ``prefzoo/alive/RANK`` into the process group's key-value store (the launcher's, on
    node 0), then waits for the others; a dead or hung rank never writes its key.
    """
    try:
        import torch.distributed as dist

        from prefzoo._thirdparty import default_store

        if not (dist.is_available() and dist.is_initialized()):
            return None
        store = default_store()
        store.set_timeout(timedelta(seconds=max(1.0, wait_s)))
        rank, world = dist.get_rank(), dist.get_world_size()
        store.set(f"prefzoo/alive/{rank}", socket.gethostname())
        deadline = time.monotonic() + wait_s
        missing = list(range(world))
        while missing and time.monotonic() < deadline:
            missing = [r for r in missing if not store.check([f"prefzoo/alive/{r}"])]
            if missing:
                time.sleep(0.2)
        return missing
    except Exception:  # the store itself is gone (its host died): nothing more to learn
        return None
