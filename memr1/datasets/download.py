"""Fetch a data file once, verified by its sha256.

`ensure_file` leaves a present file alone when its checksum matches and refuses it when it does not;
an absent file is downloaded to a temporary file beside the target, checked, and only then moved into
place, so an interrupted or corrupt download never looks like the real file.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.request
from pathlib import Path
from typing import BinaryIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

_CHUNK_BYTES = 1 << 16


class DownloadError(OSError):
    """A file could not be fetched; the message says where to put it by hand."""


class ChecksumMismatchError(ValueError):
    """A file's sha256 is not the expected one."""

    def __init__(self, path: str | Path, expected: str, actual: str, hint: str) -> None:
        self.path = str(path)
        self.expected = expected
        self.actual = actual
        super().__init__(f"{self.path}: sha256 is {actual}, expected {expected}. {hint}")


def sha256_of(path: str | Path) -> str:
    """The hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def ensure_file(
    path: str | Path, url: str, sha256: str, *, timeout_s: float = 60.0, show_progress: bool = True
) -> Path:
    """`path`, downloaded from `url` first if absent; its sha256 must be `sha256` either way.

    Raises `ChecksumMismatchError` (path, expected and actual hash) for a present file or a download
    with another checksum, and `DownloadError` (saying where to put the file by hand) when the
    download fails.
    """
    path = Path(path)
    expected = sha256.lower()
    if path.exists():
        actual = sha256_of(path)
        if actual != expected:
            hint = f"Delete it to download it again from {url}, or put the right file there."
            raise ChecksumMismatchError(path, expected, actual, hint)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # A temporary file in the target's directory, so that the final rename is atomic.
    descriptor, temporary_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    temporary = Path(temporary_name)
    try:
        with os.fdopen(descriptor, "wb") as file:
            actual = _download(url, file, path.name, timeout_s, show_progress)
        if actual != expected:
            hint = f"The download from {url} is not the expected file; nothing was written."
            raise ChecksumMismatchError(path, expected, actual, hint)
        os.replace(temporary, path)
    except (OSError, http.client.HTTPException) as error:
        raise DownloadError(
            f"could not download {url} to {path}: {error}. "
            f"Without network access, fetch that file elsewhere and put it at {path} (sha256 {expected})."
        ) from error
    finally:
        temporary.unlink(missing_ok=True)
    return path


def _download(url: str, file: BinaryIO, label: str, timeout_s: float, show_progress: bool) -> str:
    """Stream `url` into `file` with a progress bar on stderr; return the hex sha256 of the bytes."""
    digest = hashlib.sha256()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        length = response.headers.get("Content-Length")
        with Progress(*columns, console=Console(stderr=True), disable=not show_progress) as progress:
            task = progress.add_task(f"downloading {label}", total=int(length) if length else None)
            for chunk in iter(lambda: response.read(_CHUNK_BYTES), b""):
                file.write(chunk)
                digest.update(chunk)
                progress.advance(task, len(chunk))
    return digest.hexdigest()
