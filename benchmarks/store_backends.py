"""The two stores of record side by side: Milvus Lite (a `.db` file) and Qdrant's embedded mode (a
`qdrant:` directory), the same bank operations on each, in one run.

For each size a fresh bank is filled through `MemoryBank.add_many` with random unit vectors (dim 384)
split between two speakers, then: one memory added at a time (`add_many` of one op with its vector:
the store's write and the index's update, the embedder not timed), the store's own top-30 search with
a speaker filter (`search_in_store`; the bank's everyday `search` is the in-process index, the same
for both stores), and a reopen (every row read back). "Qdrant / Milvus" is the ratio of the p50s.

    .venv/bin/python benchmarks/store_backends.py --out runs/bench/store_backends.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bank_search import DIM, K, SPEAKERS, percentiles, timed, unit_vectors  # noqa: E402  (beside this script)
from machine import machine_info, print_machine  # noqa: E402
from memr1.embed import Embedder  # noqa: E402
from memr1.memory import MemoryBank  # noqa: E402
from memr1.types import MemoryOp, OpKind  # noqa: E402

STORES = {"Milvus Lite": lambda workdir, n: str(workdir / f"bench_{n}.db"), "Qdrant (embedded)": lambda workdir, n: f"qdrant:{workdir / f'bench_{n}.qdrant'}"}


def run_store(uri: str, n: int, embedder: Embedder, adds: int, searches: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)  # the same vectors and queries for every store
    vectors, queries, extra = unit_vectors(rng, n), unit_vectors(rng, searches), unit_vectors(rng, adds)
    ops = [MemoryOp(OpKind.ADD, f"memory {i}", speaker=SPEAKERS[i % 2]) for i in range(n)]
    name = f"bench_{n}"
    with MemoryBank.open(uri, name, embedder) as bank:
        start = time.perf_counter()
        bank.add_many(ops, vectors)
        insert_s = time.perf_counter() - start
        add_ms = []
        for i, vector in enumerate(extra):
            start = time.perf_counter()
            bank.add_many([MemoryOp(OpKind.ADD, f"added {i}", speaker=SPEAKERS[i % 2])], vector[None, :])
            add_ms.append((time.perf_counter() - start) * 1e3)
        search_ms, hits = timed(lambda q: [e.id for e in bank.search_in_store(q, SPEAKERS[0], K)], queries)
        index_hits = [[e.id for e in bank.search_by_vector(q, SPEAKERS[0], K)] for q in queries]
    start = time.perf_counter()
    with MemoryBank.open(uri, name, embedder) as reopened:
        reopen_s = time.perf_counter() - start
        assert len(reopened) == n + adds
    return {
        "insert_rows_per_s": n / insert_s,
        "add": percentiles(add_ms),
        "search": percentiles(search_ms),
        "reopen_s": reopen_s,
        "top30_equal_to_index": float(np.mean([ours == theirs for ours, theirs in zip(hits, index_hits)])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--adds", type=int, default=100, help="memories added one at a time after the bulk load")
    parser.add_argument("--searches", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    embedder = Embedder()
    print_machine()
    load_before = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            row = {"entries": n}
            for store, uri in STORES.items():
                row[store] = run_store(uri(Path(tmp), n), n, embedder, args.adds, args.searches, args.seed)
            results.append(row)
    machine = machine_info(load_before, os.getloadavg()[0])

    table = Table(title=f"stores of record: top-{K} search with a speaker filter (half the rows), dim {DIM}")
    for column in ("entries", "store", "bulk rows/s", "add p50 / p95 ms", "search p50 / p95 ms", "reopen s", "= index", "search vs Milvus", "add vs Milvus"):
        table.add_column(column, justify="right")
    for row in results:
        base = row["Milvus Lite"]
        for store in STORES:
            r = row[store]
            table.add_row(
                f"{row['entries']:,}", store, f"{r['insert_rows_per_s']:,.0f}",
                f"{r['add']['p50_ms']:.2f} / {r['add']['p95_ms']:.2f}", f"{r['search']['p50_ms']:.2f} / {r['search']['p95_ms']:.2f}",
                f"{r['reopen_s']:.2f}", f"{r['top30_equal_to_index']:.0%}",
                f"{r['search']['p50_ms'] / base['search']['p50_ms']:.2f}x", f"{r['add']['p50_ms'] / base['add']['p50_ms']:.2f}x",
            )
    Console().print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)}, "results": results, "machine": machine}, indent=2))


if __name__ == "__main__":
    main()
