"""Checkpoint files a kill cannot corrupt, and the newest complete one found on resume.

- every checkpoint is written to a temporary file and renamed into place (`AtomicCheckpointIO`), so
  a SIGKILL mid-write leaves the previous checkpoints and a stray `.tmp`, never a truncated `.ckpt`;
- `ckpt_path=last` is the newest checkpoint that loads (`latest_checkpoint`), not a symlink that a
  kill between two file operations could leave dangling.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from memr1.faults import fault_point

log = logging.getLogger(__name__)

_STEP = re.compile(r"step=(\d+)")


class AtomicCheckpointIO(TorchCheckpointIO):
    """`torch.save` to `<path>.tmp`, fsync, then `os.replace`: a checkpoint is whole or absent."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp")
        with open(temporary, "wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())
        fault_point("checkpoint_write")
        os.replace(temporary, path)


def checkpoint_step(path: Path) -> int:
    """The global step in a checkpoint's file name (`...step=N...ckpt`); -1 when it has none."""
    match = _STEP.search(path.name)
    return int(match.group(1)) if match else -1


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest checkpoint in `directory` that loads: the highest step, the newest file among equal
    steps; symlinks and temporary files are never candidates. None when there is none."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    candidates = [p for p in directory.glob("*.ckpt") if p.is_file() and not p.is_symlink()]
    candidates.sort(key=lambda p: (checkpoint_step(p), p.stat().st_mtime), reverse=True)
    for path in candidates:
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except Exception as error:  # noqa: BLE001 - any unreadable file is skipped, and said so
            log.warning("skipping unreadable checkpoint %s: %s", path, error)
            continue
        if isinstance(checkpoint, dict) and "loops" in checkpoint and "state_dict" in checkpoint:
            return path
        log.warning("skipping %s: not a Lightning training checkpoint", path)
    return None
