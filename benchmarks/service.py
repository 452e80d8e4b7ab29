"""The memory service's cost, measured in one run, in three sections:

- `answer`: requests/s and p50 / p95 latency of `POST /search` and `POST /answer` through `memr1 serve`
  (a real uvicorn subprocess on loopback, the embedded SmolLM2-135M-Instruct as the Answer Agent),
  beside the same calls on `memr1.Memory` in process. The memories are LoCoMo conv-30's observation
  facts (ADDed as they are, `infer=False`), the queries its first N validation questions; the
  in-process calls run first, then the server opens the same memories. Each side makes one untimed
  answer call first (it warms the model). Over HTTP, the MCP endpoint (`/mcp`, a plain JSON-RPC
  client) searches the same queries, and adds are timed through REST and through MCP (`add_memories`)
  beside each other.
- `tenants`: many users in the one collection (Milvus Lite, in process). The cost of a new user's
  first memory (`Memory.add`), beside an existing user's next one, the embedding alone, and what the
  per-scope layout of earlier versions paid (a collection per user); search p50 / p95 with `--users`
  users of 3 memories each (LoCoMo's facts), through `Memory.search` and the store alone.
- `replicas`: `--workers` clients adding and searching (alternately, over 10 users each) for
  `--seconds`, against one and then two `memr1 serve` replicas on one Milvus server (the `milvus`
  package's), beside the same load on a `Memory` in process on that server. On a 2-core machine the
  server, the replicas and the clients share the cores, so two replicas cannot add throughput there;
  the section shows what they cost.

    .venv/bin/python benchmarks/service.py --quick                 # small sizes, a smoke run
    .venv/bin/python benchmarks/service.py --out runs/bench/service.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from machine import machine_info, print_machine  # noqa: E402  (benchmarks/machine.py, beside this script)
from memr1.datasets.locomo import parse_locomo  # noqa: E402
from memr1.embed import Embedder  # noqa: E402
from memr1.memory.local_server import local_milvus_server  # noqa: E402
from memr1.memory.records import added  # noqa: E402
from memr1.memory.store import MilvusStore  # noqa: E402
from memr1.service import Memory, text_model  # noqa: E402
from memr1.service.scopes import now, unix_of_dialogue_time, uuid7  # noqa: E402
from memr1.types import MemoryOp, OpKind  # noqa: E402

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


def start_server(path: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """`memr1 serve --path path ARGS` on a free loopback port, once it answers /health."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "memr1.cli", "serve", "--path", str(path), "--port", str(port), *args]
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


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=60)


# -- answer: search and answer, in process and over HTTP -------------------------------------------

def lookup_option(args: argparse.Namespace) -> dict:
    """The --prompt-lookup given, else the service's default (none passed)."""
    return {} if args.prompt_lookup is None else {"prompt_lookup": args.prompt_lookup}


def answer_section(args: argparse.Namespace, conversation, scratch: Path) -> tuple[dict, Table]:
    questions = [q.question for q in conversation.questions][: args.questions]
    results: dict[str, dict] = {}
    adapter = None if args.answer == "base" else args.answer
    answerer = text_model(MODEL, adapter=adapter, **lookup_option(args))
    memory = Memory(scratch, answerer=answerer, k=args.k, max_new_tokens=args.max_new_tokens, distill=not args.no_distill)
    for fact in conversation.facts:  # dated by their sessions, as evaluation's banks are
        memory.add(fact.text, user_id=USER, infer=False, timestamp=unix_of_dialogue_time(fact.date_time))
    memory.answer(questions[0], user_id=USER)  # warm-up, untimed: the first generation allocates
    search_s, search_wall = timed([lambda q=q: memory.search(q, user_id=USER, top_k=args.k) for q in questions])
    answer_s, answer_wall = timed([lambda q=q: memory.answer(q, user_id=USER) for q in questions[: args.answers]])
    results["in_process"] = {
        "search": {**percentiles(search_s), "per_s": len(search_s) / search_wall},
        "answer": {**percentiles(answer_s), "per_s": len(answer_s) / answer_wall},
    }
    memory.close()
    del answerer

    agent = ["--answer", args.answer, *(["--no-distill"] if args.no_distill else [])]
    if args.prompt_lookup is not None:
        agent += ["--prompt-lookup", str(args.prompt_lookup)]
    process, url = start_server(scratch, "--model", MODEL, *agent, "--k", str(args.k), "--max-new-tokens", str(args.max_new_tokens))
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            def post(route: str, body: dict) -> None:
                client.post(route, json=body).raise_for_status()

            def tool(name: str, arguments: dict) -> None:  # a plain JSON-RPC client: no session, no initialize
                body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
                reply = client.post("/mcp", json=body)
                reply.raise_for_status()
                if reply.json()["result"]["isError"]:
                    raise RuntimeError(f"MCP {name}: {reply.json()['result']['content'][0]['text']}")

            post("/answer", {"question": questions[0], "user_id": USER})  # warm-up, untimed
            search_s, search_wall = timed([lambda q=q: post("/search", {"query": q, "user_id": USER, "top_k": args.k}) for q in questions])
            answer_s, answer_wall = timed([lambda q=q: post("/answer", {"question": q, "user_id": USER}) for q in questions[: args.answers]])
            # The same questions reworded by a suffix: the server's embedder caches by text, and REST
            # has just embedded these.
            mcp_search_s, mcp_search_wall = timed([lambda q=q: tool("search_memory", {"query": f"{q} (mcp)", "user_id": USER, "limit": args.k}) for q in questions])
            # Adds of new texts (the embedder caches by text) into users of their own, REST then MCP.
            texts = [f"{fact.text} ({n})" for n, fact in enumerate(conversation.facts[: len(questions)])]
            add_s, add_wall = timed([lambda t=t: post("/memories", {"messages": [{"role": "user", "content": t}], "user_id": "bench-rest"}) for t in texts])
            mcp_add_s, mcp_add_wall = timed([lambda t=t: tool("add_memories", {"text": f"{t}.", "user_id": "bench-mcp"}) for t in texts])
        clients = [httpx.Client(base_url=url, timeout=600) for _ in range(args.workers)]
        calls = [
            lambda q=q, c=clients[i % args.workers]: c.post("/search", json={"query": q, "user_id": USER, "top_k": args.k}).raise_for_status()
            for i, q in enumerate(questions)
        ]
        search_concurrent = concurrent(calls, args.workers)
        for client in clients:
            client.close()
    finally:
        stop([process])
    results["http"] = {
        "search": {**percentiles(search_s), "per_s": len(search_s) / search_wall, f"per_s_{args.workers}_clients": search_concurrent},
        "answer": {**percentiles(answer_s), "per_s": len(answer_s) / answer_wall},
        "add": {**percentiles(add_s), "per_s": len(add_s) / add_wall},
    }
    results["mcp"] = {
        "search": {**percentiles(mcp_search_s), "per_s": len(mcp_search_s) / mcp_search_wall},
        "add": {**percentiles(mcp_add_s), "per_s": len(mcp_add_s) / mcp_add_wall},
    }
    agent = f"{args.answer}{', no distill' if args.no_distill else ''}"
    table = Table(title=f"memr1 serve vs in-process Memory (conv-30, {len(conversation.facts)} memories, k={args.k}, answer {agent}; "
                        f"{args.workers} clients at once: {search_concurrent:.1f} searches/s)")
    for column in ("call", "side", "n", "p50 ms", "p95 ms", "per s", "p50 / in-process (add: / REST)"):
        table.add_column(column, justify="right")
    for call, sides in (("search", ("in_process", "http", "mcp")), ("answer", ("in_process", "http")), ("add", ("http", "mcp"))):
        for side in sides:
            row = results[side][call]
            base = results["in_process" if call != "add" else "http"][call]["p50_ms"]
            label = {"in_process": "in process", "http": "REST", "mcp": "MCP (JSON-RPC)"}[side]
            table.add_row(call, label, str(row["n"]), f"{row['p50_ms']:.1f}", f"{row['p95_ms']:.1f}", f"{row['per_s']:.2f}", f"{row['p50_ms'] / base:.2f}x")
    return results, table


# -- tenants: many users in one collection ---------------------------------------------------------

def tenants_section(args: argparse.Namespace, facts: list[str], embedder: Embedder, scratch: Path) -> tuple[dict, Table]:
    rng = random.Random(0)
    vectors = embedder.encode(facts)
    per_user = 3
    with Memory(scratch / "tenants", embedder=embedder) as memory:
        started, batch, when = time.perf_counter(), [], now()
        for user in range(args.users):
            for j in range(per_user):
                i = (user * per_user + j) % len(facts)
                scope = f"user_id=user{user}"
                batch.append(added(MemoryOp(OpKind.ADD, facts[i], speaker=scope, timestamp=when), scope, uuid7(), 0, vectors[i]))
            if len(batch) >= 3_000:
                memory.store.write(batch)
                batch = []
        memory.store.write(batch)
        memory.store.flush()
        fill_s = time.perf_counter() - started
        rows = memory.store.count()
        # Texts the embedder has not seen (it caches by text), so each call pays for its embedding.
        picked = [facts[rng.randrange(len(facts))] for _ in range(args.new_users)]
        new_user_s, _ = timed([lambda n=n, t=t: memory.add(f"{t} ({n})", user_id=f"new{n}", infer=False) for n, t in enumerate(picked)])
        existing_s, _ = timed([lambda n=n, t=t: memory.add(f"{t} <{n}>", user_id=f"user{n}", infer=False) for n, t in enumerate(picked)])
        embed_s, _ = timed([lambda n=n, t=t: embedder.encode([f"{t} [{n}]"]) for n, t in enumerate(picked)])
        users = [f"user{rng.randrange(args.users)}" for _ in range(args.searches)]
        queries = [f"{facts[rng.randrange(len(facts))]} ?{n}" for n in range(args.searches)]
        search_s, _ = timed([lambda u=u, q=q: memory.search(q, user_id=u, top_k=30) for u, q in zip(users, queries)])
        query_vectors = embedder.encode(queries)
        store_s, _ = timed([lambda u=u, v=v: memory.store.search(v[None, :], f"user_id={u}", None, 30) for u, v in zip(users, query_vectors)])
    # What each new user cost in the per-scope layout: a collection of its own, then the ADD.
    collection_s, _ = timed([
        lambda n=n: per_scope_user(scratch / "per_scope.db", f"scope_{n}", facts[n], embedder) for n in range(args.collection_users)
    ])
    results = {
        "users": args.users, "rows": rows, "fill_s": fill_s,
        "new_user_add": percentiles(new_user_s), "existing_user_add": percentiles(existing_s), "embedding_only": percentiles(embed_s),
        "new_user_per_scope_collection": percentiles(collection_s),
        "search_memory_api": percentiles(search_s), "search_store_only": percentiles(store_s),
    }
    table = Table(title=f"{args.users:,} users x {per_user} memories in one collection (Milvus Lite, {rows:,} rows, filled in {fill_s:.0f} s)")
    for column in ("call", "n", "p50 ms", "p95 ms"):
        table.add_column(column, justify="right")
    for name, key in [("new user: Memory.add (embedding + insert)", "new_user_add"), ("existing user: Memory.add", "existing_user_add"),
                      ("the embedding alone", "embedding_only"),
                      ("new user, per-scope layout: a collection + ADD", "new_user_per_scope_collection"),
                      ("search top-30: Memory.search", "search_memory_api"), ("search top-30: the store alone", "search_store_only")]:
        row = results[key]
        table.add_row(name, str(row["n"]), f"{row['p50_ms']:.1f}", f"{row['p95_ms']:.1f}")
    return results, table


def per_scope_user(uri: Path, name: str, text: str, embedder: Embedder) -> None:
    store = MilvusStore.open(str(uri.resolve()), embedder.dim, "", name)
    try:
        op = MemoryOp(OpKind.ADD, text, speaker=f"user_id={name}", timestamp=now())
        store.write([added(op, op.speaker, uuid7(), 0, embedder.encode([text])[0])])
    finally:
        store.close()


# -- replicas: one and two `memr1 serve` on one Milvus server ---------------------------------------

def mixed_load(add: Callable[[str, str], object], search: Callable[[str, str], object], facts: list[str], workers: int, seconds: float) -> dict:
    """`workers` threads alternating add / search over 10 users each for `seconds`: calls/s and latencies."""
    deadline = time.monotonic() + seconds
    latencies: list[list[float]] = [[] for _ in range(workers)]

    def work(worker: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            user, text = f"load{worker}-{n % 10}", facts[(worker * 7919 + n) % len(facts)]
            started = time.perf_counter()
            (add if n % 2 == 0 else search)(user, text)
            latencies[worker].append(time.perf_counter() - started)
            n += 1

    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(work, range(workers)))
    flat = [s for per_worker in latencies for s in per_worker]
    return {**percentiles(flat), "per_s": len(flat) / (time.perf_counter() - started)}


def replicas_section(args: argparse.Namespace, facts: list[str], embedder: Embedder, scratch: Path) -> tuple[dict, Table]:
    results: dict[str, dict] = {}
    (scratch / "milvus").mkdir()
    with local_milvus_server(scratch / "milvus") as uri:
        with Memory(scratch / "in-process", uri=uri, embedder=embedder) as memory:
            results["in_process"] = mixed_load(
                lambda user, text: memory.add(text, user_id=user, infer=False),
                lambda user, text: memory.search(text, user_id=user, top_k=10),
                facts, args.workers, args.seconds,
            )
        for replicas in (1, 2):
            servers = [start_server(scratch / f"replica-{replicas}-{r}", "--uri", uri, "--answer", "none") for r in range(replicas)]
            clients = [httpx.Client(base_url=url, timeout=600) for _, url in servers]
            try:
                def client_of(user: str) -> httpx.Client:
                    return clients[int(user.split("-")[1]) % replicas]  # each user's calls spread over the replicas

                results[f"replicas_{replicas}"] = mixed_load(
                    lambda user, text: client_of(user).post("/memories", json={"messages": [{"role": "user", "content": text}], "user_id": user, "infer": False}).raise_for_status(),
                    lambda user, text: client_of(user).post("/search", json={"query": text, "user_id": user, "top_k": 10}).raise_for_status(),
                    facts, args.workers, args.seconds,
                )
            finally:
                for client in clients:
                    client.close()
                stop([process for process, _ in servers])
    table = Table(title=f"{args.workers} clients adding and searching for {args.seconds:.0f} s on one Milvus server (2.3.5)")
    for column in ("side", "calls", "per s", "p50 ms", "p95 ms"):
        table.add_column(column, justify="right")
    for side, label in [("in_process", "Memory in process"), ("replicas_1", "1 replica (HTTP)"), ("replicas_2", "2 replicas (HTTP)")]:
        row = results[side]
        table.add_row(label, str(row["n"]), f"{row['per_s']:.1f}", f"{row['p50_ms']:.1f}", f"{row['p95_ms']:.1f}")
    return results, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT / ".." / "shared" / "data" / "locomo10.json")
    parser.add_argument("--sections", default="answer,tenants,replicas", help="comma-separated: answer, tenants, replicas")
    parser.add_argument("--questions", type=int, default=40, help="answer: search queries (each run in process and over HTTP)")
    parser.add_argument("--answers", type=int, default=40, help="answer: answer calls on each side (the first of the questions)")
    parser.add_argument("--k", type=int, default=5, help="answer: memories shown to the Answer Agent")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--answer", default="base", help="answer: the Answer Agent, 'base' (the untrained backbone) or a shipped agent (trained:NAME)")
    parser.add_argument("--no-distill", action="store_true", help="answer: answer directly, without listing the memories used")
    parser.add_argument("--prompt-lookup", type=int, help="answer: draft tokens per forward (memr1 serve --prompt-lookup; 0: token by token; default: the service's)")
    parser.add_argument("--workers", type=int, default=4, help="concurrent clients (answer: searches; replicas: the mixed load)")
    parser.add_argument("--users", type=int, default=10_000, help="tenants: users in the collection")
    parser.add_argument("--new-users", type=int, default=200, help="tenants: new users timed")
    parser.add_argument("--collection-users", type=int, default=20, help="tenants: new users timed in the per-scope layout")
    parser.add_argument("--searches", type=int, default=200, help="tenants: searches timed")
    parser.add_argument("--seconds", type=float, default=15.0, help="replicas: seconds of load per side")
    parser.add_argument("--quick", action="store_true", help="small sizes: 8 questions, 4 answers, 500 users, 3 s of load")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.questions, args.answers, args.users, args.new_users, args.collection_users, args.searches, args.seconds = 8, 4, 500, 20, 3, 20, 3.0
    sections = [name.strip() for name in args.sections.split(",")]
    unknown = set(sections) - {"answer", "tenants", "replicas"}
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}; choose among answer, tenants, replicas")
    print_machine()
    load_before = os.getloadavg()[0]
    conversations = parse_locomo(args.data, (5,)).conversations
    conversation = next(c for c in conversations if c.sample_id == "conv-30")
    facts = list(dict.fromkeys(fact.text for c in conversations for fact in c.facts))
    embedder = Embedder()

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="memr1-bench-service-") as scratch:
        for name in sections:
            section = {"answer": lambda: answer_section(args, conversation, Path(scratch) / "answer"),
                       "tenants": lambda: tenants_section(args, facts, embedder, Path(scratch)),
                       "replicas": lambda: replicas_section(args, facts, embedder, Path(scratch))}[name]
            results[name], table = section()
            Console().print(table)
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
