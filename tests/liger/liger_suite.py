"""Run Liger-Kernel 0.8.5's own preference-loss tests against prefzoo's classes (``tox -e liger``).

    python tests/liger/liger_suite.py SDIST_DIR WORK_DIR [pytest args]

Takes the liger-kernel sdist that ``pip download`` put in SDIST_DIR, extracts ``test/chunked_loss/test_{dpo,simpo,
orpo,cpo,kto}_loss.py`` and the helpers they import (``test/__init__.py``, ``test/utils.py``, ``test/conftest.py``,
``test/chunked_loss/__init__.py``) into WORK_DIR (regular files only, no path outside it), and runs them with
:mod:`liger_shim` (Liger's classes replaced by prefzoo's; ``PREFZOO_LIGER_SIDE=liger`` runs Liger's own).  The
(8, 128, 1024, 4096) shape is left out for time (376 of the 975 cases).
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

LOSSES = ("dpo", "simpo", "orpo", "cpo", "kto")
HELPERS = ("test/__init__.py", "test/utils.py", "test/conftest.py", "test/chunked_loss/__init__.py")
WANTED = HELPERS + tuple(f"test/chunked_loss/test_{n}_loss.py" for n in LOSSES)


def extract(sdist_dir: Path, work: Path) -> list[Path]:
    """The wanted test files from the one liger_kernel-*.tar.gz in ``sdist_dir``, written under ``work``."""
    archives = sorted(sdist_dir.glob("liger_kernel-*.tar.gz"))
    if len(archives) != 1:
        raise SystemExit(f"{sdist_dir}: expected one liger_kernel-*.tar.gz from pip download, found {len(archives)}")
    written = []
    with tarfile.open(archives[0], "r:gz") as tar:
        for member in tar.getmembers():
            rel = member.name.split("/", 1)[-1]
            if rel not in WANTED:
                continue
            if not member.isreg():
                raise SystemExit(f"{archives[0].name}: {member.name} is not a regular file")
            src = tar.extractfile(member)
            assert src is not None
            dest = work / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(src.read())
            written.append(dest)
    missing = set(WANTED) - {p.relative_to(work).as_posix() for p in written}
    if missing:
        raise SystemExit(f"{archives[0].name}: missing {sorted(missing)}")
    return written


def main(argv: list[str]) -> int:
    import os

    import pytest

    sdist_dir, work, extra = Path(argv[0]), Path(argv[1]).resolve(), argv[2:]
    extract(sdist_dir, work)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # liger_shim
    os.chdir(work)
    files = [f"test/chunked_loss/test_{n}_loss.py" for n in LOSSES]
    return int(pytest.main(["-p", "liger_shim", "-p", "no:cacheprovider", "--rootdir", str(work), "-q",
                            "-k", "not 4096", *files, *extra]))  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
