"""The memory service's cost: requests/s and p50 / p95 latency of `POST /search` and `POST /answer`
through `memr1 serve` (a real uvicorn subprocess on loopback, the embedded SmolLM2-135M-Instruct as
the Answer Agent), beside the same calls on `memr1.Memory` in process, measured in one run.

The memories are LoCoMo conv-30's observation facts (ADDed as they are, `infer=False`), the queries
its first N validation questions. The in-process calls run first; the Memory is then closed and the
server opens the same banks, so both sides search identical data with the same model. Each side
makes one untimed answer call first (it opens the bank and warms the model).

    .venv/bin/python benchmarks/service.py --quick                 # 8 questions, 4 answers
    .venv/bin/python benchmarks/service.py --out runs/bench/service.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from machine import machine_info, print_machine  # noqa: E402  (benchmarks/machine.py, beside this script)
from memr1.datasets.locomo import parse_locomo  # noqa: E402
from memr1.service import Memory, text_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = "embedded:smollm2-135m-instruct"
USER = "conv-30"


def percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "n": len(ordered),
        "p50_ms": 1000 * statistics.median(ordered),
        "p95_ms": 1000 * ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
    }


def timed(calls: list) -> tuple[list[float], float]:
    """Per-call seconds and wall seconds of running `calls` one after another."""
    per_call, started = [], time.perf_counter()
    for call in calls:
        t0 = time.perf_counter()
        call()
        per_call.append(time.perf_counter() - t0)
    return per_call, time.perf_counter() - started


def concurrent(calls: list, workers: int) -> float:
    """Requests per second with `workers` clients at once."""
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda call: call(), calls))
    return len(calls) / (time.perf_counter() - started)


def start_server(path: Path, k: int, max_new_tokens: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "memr1.cli", "serve", "--path", str(path), "--port", str(port), "--model", MODEL, "--k", str(k), "--max-new-tokens", str(max_new_tokens)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.5)
    process.kill()
    raise TimeoutError("memr1 serve did not come up in 5 minutes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT / ".." / "shared" / "data" / "locomo10.json")
    parser.add_argument("--questions", type=int, default=40, help="search queries (each run in process and over HTTP)")
    parser.add_argument("--answers", type=int, default=12, help="answer calls on each side")
    parser.add_argument("--k", type=int, default=5, help="memories shown to the Answer Agent")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4, help="concurrent clients for the search throughput")
    parser.add_argument("--quick", action="store_true", help="8 questions, 4 answers")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.questions, args.answers = 8, 4
    print_machine()
    load_before = os.getloadavg()[0]
    conversation = next(c for c in parse_locomo(args.data, (5,)).conversations if c.sample_id == "conv-30")
    questions = [q.question for q in conversation.questions][: args.questions]

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="memr1-bench-service-") as scratch:
        path = Path(scratch)
        answerer = text_model(MODEL)
        memory = Memory(path, answerer=answerer, k=args.k, max_new_tokens=args.max_new_tokens)
        for fact in conversation.facts:
            memory.add(fact.text, user_id=USER, infer=False)
        memory.answer(questions[0], user_id=USER)  # warm-up, untimed: the first generation allocates
        search_s, search_wall = timed([lambda q=q: memory.search(q, user_id=USER, top_k=args.k) for q in questions])
        answer_s, answer_wall = timed([lambda q=q: memory.answer(q, user_id=USER) for q in questions[: args.answers]])
        results["in_process"] = {
            "search": {**percentiles(search_s), "per_s": len(search_s) / search_wall},
            "answer": {**percentiles(answer_s), "per_s": len(answer_s) / answer_wall},
        }
        memory.close()
        del answerer

        process, url = start_server(path, args.k, args.max_new_tokens)
        try:
            with httpx.Client(base_url=url, timeout=600) as client:
                def post(route: str, body: dict) -> None:
                    client.post(route, json=body).raise_for_status()

                post("/answer", {"question": questions[0], "user_id": USER})  # warm-up, untimed: opens the bank
                search_calls = [lambda q=q: post("/search", {"query": q, "user_id": USER, "top_k": args.k}) for q in questions]
                search_s, search_wall = timed(search_calls)
                answer_s, answer_wall = timed([lambda q=q: post("/answer", {"question": q, "user_id": USER}) for q in questions[: args.answers]])
            clients = [httpx.Client(base_url=url, timeout=600) for _ in range(args.workers)]
            calls = [
                lambda q=q, c=clients[i % args.workers]: c.post("/search", json={"query": q, "user_id": USER, "top_k": args.k}).raise_for_status()
                for i, q in enumerate(questions)
            ]
            search_concurrent = concurrent(calls, args.workers)
            for client in clients:
                client.close()
        finally:
            process.terminate()
            process.wait(timeout=60)
        results["http"] = {
            "search": {**percentiles(search_s), "per_s": len(search_s) / search_wall, f"per_s_{args.workers}_clients": search_concurrent},
            "answer": {**percentiles(answer_s), "per_s": len(answer_s) / answer_wall},
        }

    table = Table(title=f"memr1 serve vs in-process Memory (conv-30, {len(conversation.facts)} memories, k={args.k})")
    for column in ("call", "side", "n", "p50 ms", "p95 ms", "per s", "p50 HTTP / in-process"):
        table.add_column(column, justify="right")
    for call in ("search", "answer"):
        for side in ("in_process", "http"):
            row = results[side][call]
            ratio = row["p50_ms"] / results["in_process"][call]["p50_ms"]
            table.add_row(call, side, str(row["n"]), f"{row['p50_ms']:.1f}", f"{row['p95_ms']:.1f}", f"{row['per_s']:.2f}", f"{ratio:.2f}x")
    Console().print(table)
    print(f"search over HTTP with {args.workers} clients at once: {results['http']['search'][f'per_s_{args.workers}_clients']:.1f} requests/s")
    report = {
        "settings": vars(args) | {"data": str(args.data), "out": str(args.out), "memories": len(conversation.facts)},
        "results": results,
        "machine": machine_info(load_before, os.getloadavg()[0]),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
