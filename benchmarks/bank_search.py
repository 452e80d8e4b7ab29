"""Memory-bank search latency: the in-process index beside numpy brute force, Milvus Lite's own
filtered search, and a fork carrying ~50 overlay ops (plus the cost of `fork()` itself).

Each size gets a fresh Milvus Lite bank filled through `MemoryBank.add_many` with random unit vectors
(dim 384) split between two speakers. Every search is top-30 with a speaker filter; query vectors are
precomputed, so the embedder is never timed. "agree" is the share of queries whose index top-30 ids
equal brute force's.

    .venv/bin/python benchmarks/bank_search.py                       # 1k, 10k, 100k (100k inserts take ~30 s)
    .venv/bin/python benchmarks/bank_search.py --sizes 1000 10000 --out bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from memr1.embed import Embedder  # noqa: E402
from memr1.memory import MemoryBank  # noqa: E402
from memr1.types import MemoryOp, OpKind  # noqa: E402
from machine import machine_info, print_machine  # noqa: E402  (benchmarks/machine.py, beside this script)

DIM = 384
K = 30
SPEAKERS = ("Caroline", "Melanie")
FORK_OPS = 50


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, DIM) float32 rows of unit norm."""
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def brute_force(vectors: np.ndarray, mask: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    """Top-k row indices among rows where `mask` holds. vectors (n, DIM) float32, mask (n,) bool, query (DIM,)."""
    scores = vectors @ query
    scores[~mask] = -np.inf
    best = np.argpartition(-scores, k)[:k]
    return best[np.argsort(-scores[best])]


def timed(call: Callable[[np.ndarray], object], queries: np.ndarray) -> tuple[list[float], list[object]]:
    """Milliseconds per call (after two warm-up calls) and the results."""
    for query in queries[:2]:
        call(query)
    times, results = [], []
    for query in queries:
        start = time.perf_counter()
        results.append(call(query))
        times.append((time.perf_counter() - start) * 1e3)
    return times, results


def percentiles(times: list[float]) -> dict[str, float]:
    return {"p50_ms": float(np.percentile(times, 50)), "p95_ms": float(np.percentile(times, 95))}


def fork_ops(bank: MemoryBank, rng: np.random.Generator) -> list[MemoryOp]:
    """~50 ops for a fork: half ADDs, the rest UPDATEs and DELETEs of distinct existing memories."""
    targets = [entry.id for entry in bank.entries(SPEAKERS[0])[: FORK_OPS // 2]]
    rng.shuffle(targets)
    adds = [MemoryOp(OpKind.ADD, f"fork memory {i}", speaker=SPEAKERS[i % 2]) for i in range(FORK_OPS // 2)]
    updates = [MemoryOp(OpKind.UPDATE, f"fork revision {i}", target_id=t) for i, t in enumerate(targets[::2])]
    deletes = [MemoryOp(OpKind.DELETE, target_id=t) for t in targets[1::2]]
    return adds + updates + deletes


def run_size(n: int, embedder: Embedder, workdir: Path, num_queries: int, milvus_queries: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    vectors = unit_vectors(rng, n)
    speakers = np.array([SPEAKERS[i % 2] for i in range(n)])
    queries = unit_vectors(rng, num_queries)
    uri, name = workdir / f"bench_{n}.db", f"bench_{n}"
    ops = [MemoryOp(OpKind.ADD, f"memory {i}", speaker=str(speakers[i])) for i in range(n)]

    with MemoryBank.open(uri, name, embedder) as bank:
        start = time.perf_counter()
        entries = bank.add_many(ops, vectors)
        insert_s = time.perf_counter() - start
        row_of = {entry.id: row for row, entry in enumerate(entries)}

        index_ms, index_hits = timed(lambda q: bank.search_by_vector(q, SPEAKERS[0], K), queries)
        mask = speakers == SPEAKERS[0]
        brute_ms, brute_hits = timed(lambda q: brute_force(vectors, mask, q, K), queries)
        milvus_ms, _ = timed(lambda q: bank.search_in_store(q, SPEAKERS[0], K), queries[:milvus_queries])
        agree = np.mean(
            [[row_of[e.id] for e in ours] == list(theirs) for ours, theirs in zip(index_hits, brute_hits)]
        )

        start = time.perf_counter()
        for _ in range(1_000):
            bank.fork()
        fork_create_us = (time.perf_counter() - start) * 1e3  # per fork: total seconds / 1000 * 1e6

        fork = bank.fork()
        for op in fork_ops(bank, rng):
            fork.apply(op)
        fork_ms, _ = timed(lambda q: fork.search_by_vector(q, SPEAKERS[0], K), queries)

    start = time.perf_counter()
    with MemoryBank.open(uri, name, embedder) as reopened:
        reopen_s = time.perf_counter() - start
        assert len(reopened) == n

    return {
        "entries": n,
        "insert_rows_per_s": n / insert_s,
        "reopen_s": reopen_s,
        "index": percentiles(index_ms),
        "brute_force": percentiles(brute_ms),
        "milvus_lite": percentiles(milvus_ms),
        "fork": percentiles(fork_ms),
        "fork_create_us": fork_create_us,
        "index_over_brute_p50": float(np.median(index_ms) / np.median(brute_ms)),
        "top30_agree": float(agree),
    }


def render(results: list[dict]) -> Table:
    table = Table(title=f"bank search: top-{K}, speaker filter (half the rows), dim {DIM}")
    for column in ("entries", "insert rows/s", "reopen s", "index p50/p95 ms", "brute p50/p95 ms", "index/brute",
                   "Milvus Lite p50/p95 ms", "fork p50/p95 ms", "fork() µs", "agree"):
        table.add_column(column, justify="right")

    def pair(stats: dict[str, float]) -> str:
        return f"{stats['p50_ms']:.2f} / {stats['p95_ms']:.2f}"

    for r in results:
        table.add_row(
            f"{r['entries']:,}",
            f"{r['insert_rows_per_s']:,.0f}",
            f"{r['reopen_s']:.1f}",
            pair(r["index"]),
            pair(r["brute_force"]),
            f"{r['index_over_brute_p50']:.2f}x",
            pair(r["milvus_lite"]),
            pair(r["fork"]),
            f"{r['fork_create_us']:.1f}",
            f"{r['top30_agree']:.0%}",
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200, help="timed queries per size (index, brute force, fork)")
    parser.add_argument("--milvus-queries", type=int, default=50, help="timed Milvus Lite searches per size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    if any(size < 2 * FORK_OPS for size in args.sizes):
        parser.error(f"--sizes: each size must be at least {2 * FORK_OPS}: the fork changes {FORK_OPS // 2} memories")

    embedder = Embedder()  # only the fork's ADD / UPDATE texts are embedded, outside the timings
    console = Console(width=150)
    print_machine()
    load_before = os.getloadavg()[0]  # timings on a shared machine move with its load: keep it beside them
    results = []
    with tempfile.TemporaryDirectory(prefix="bank_search_") as workdir:
        for size in args.sizes:
            console.log(f"{size:,} entries ...")
            results.append(run_size(size, embedder, Path(workdir), args.queries, args.milvus_queries, args.seed))
    console.print(render(results))
    console.print(f"{os.cpu_count()} CPUs, 1-min load average {load_before:.2f} at start")
    if args.out:
        machine = machine_info(load_before)
        report = {"machine": machine, "k": K, "results": results}
        args.out.write_text(json.dumps(report, indent=2))
        console.log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
