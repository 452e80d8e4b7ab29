"""A Milvus standalone server on a loopback port, for tests and benchmarks that need several processes
on one Milvus (`milvus-server` 2.3.5 from the PyPI package `milvus`, a dev dependency)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def local_milvus_server(data: Path) -> Iterator[str]:
    """Start a server keeping its files (and `server.log`) under `data`; yields its URI and stops it."""
    binary = shutil.which("milvus-server") or str(Path(sys.executable).parent / "milvus-server")
    if not Path(binary).exists():
        raise FileNotFoundError("milvus-server is missing: it ships in the PyPI package milvus (pip install -e '.[dev]')")
    from pymilvus import MilvusClient

    port = _free_port()
    log = (data / "server.log").open("w")
    # Its own session: the wrapper starts the `milvus` binary as a child, and both must go at the end
    # (the binary's embedded etcd always takes peer port 2380, so a leftover server blocks the next).
    command = [binary, "--data", str(data), "--proxy-port", str(port), "--etcd-port", str(_free_port())]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"milvus-server exited with {process.returncode}:\n{(data / 'server.log').read_text()[-3000:]}")
            try:
                client = MilvusClient(uri=uri, timeout=2)
                client.list_collections()
                client.close()
                break
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield uri
    finally:
        os.killpg(process.pid, signal.SIGINT)  # the wrapper's own graceful stop of the server
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # whatever of the group is left
        log.close()
