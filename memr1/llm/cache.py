"""Where memr1 keeps converted models, and how it writes them without ever leaving half a checkpoint."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The memr1 cache directory: `cache_dir` if given, else `$MEMR1_CACHE`, else `~/.cache/memr1`."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    from_env = os.environ.get("MEMR1_CACHE")
    return Path(from_env).expanduser() if from_env else Path.home() / ".cache" / "memr1"


@contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield an empty temporary directory that becomes `target` only if the block completes.

    The temporary directory sits next to `target` (same filesystem), so the final rename is atomic: a
    reader sees either no `target` or a complete one. If the block raises, the temporary directory is
    removed and `target` is untouched. If another process created `target` meanwhile, its copy is kept
    and ours is discarded (both were written from the same source).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; a cache is meant to be readable like any directory
    try:
        yield staging
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)
