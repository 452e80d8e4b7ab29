"""The `memr1` command: the Hydra apps (`memr1 train ...`, `memr1 evaluate ...`) and small tools, one
subcommand each.

Adding a tool: write `configure(parser)` (its arguments) and `run(args) -> exit status`, and append a
`Subcommand` to `SUBCOMMANDS`. A bad file or a bad value (OSError, ValueError, which includes
`DatasetFormatError`) ends the command with a one-line message on stderr and status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from memr1.datasets.locomo import (
    ADVERSARIAL_CATEGORY,
    CATEGORY_NAMES,
    SPLITS,
    IssueKind,
    LoCoMoParse,
    parse_locomo,
    split_conversations,
    split_stats,
)
from memr1.shipped import is_shipped
from memr1.types import ADD_TEXTS


@dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# --- data-summary --------------------------------------------------------------------------------


def parse_split(text: str) -> tuple[str, tuple[str, ...] | None]:
    """`"train=conv-26"` -> ("train", ("conv-26",)); `"test=*"` -> ("test", None): the rest."""
    name, separator, ids = text.partition("=")
    if not separator or not name or not ids:
        raise argparse.ArgumentTypeError(f"expected NAME=ID[,ID...] or NAME=*, got {text!r}")
    return name, None if ids == "*" else tuple(sample_id.strip() for sample_id in ids.split(","))


def locomo_summary(
    parsed: LoCoMoParse, splits: dict[str, tuple[str, ...] | None], categories: Sequence[int]
) -> dict[str, Any]:
    """Per split and over all conversations: sizes, questions per category, dia_id repairs and drops;
    plus every repair and drop with its JSON path."""
    by_split = split_conversations(parsed.conversations, splits)
    return {
        "path": str(parsed.path),
        "categories": {str(category): CATEGORY_NAMES.get(category, "") for category in categories},
        "splits": {
            name: split_stats(conversations, parsed.issues, categories).to_dict()
            for name, conversations in by_split.items()
        },
        "all": split_stats(parsed.conversations, parsed.issues, categories).to_dict(),
        "issues": [{**asdict(issue), "kind": issue.kind.value} for issue in parsed.issues],
    }


def _configure_data_summary(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="a LoCoMo file (locomo10.json)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--include-adversarial",
        action="store_true",
        help=f"keep category {ADVERSARIAL_CATEGORY} (adversarial) questions, which are excluded by default",
    )
    parser.add_argument(
        "--split",
        dest="splits",
        action="append",
        type=parse_split,
        metavar="NAME=ID[,ID...]|NAME=*",
        help="a split and its sample_ids, * for the rest; repeat per split "
        "(default: train=conv-26 validation=conv-30 test=*)",
    )


def _run_data_summary(args: argparse.Namespace) -> int:
    excluded = () if args.include_adversarial else (ADVERSARIAL_CATEGORY,)
    categories = [category for category in CATEGORY_NAMES if category not in excluded]
    splits = dict(args.splits) if args.splits else dict(SPLITS)
    summary = locomo_summary(parse_locomo(args.path, excluded), splits, categories)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary)
    return 0


def _print_summary(summary: dict[str, Any]) -> None:
    columns = {**summary["splits"], "all": summary["all"]}
    stats = list(columns.values())
    table = Table(title=f"LoCoMo: {summary['path']}")
    table.add_column("")
    for name in columns:
        table.add_column(name, justify="right")

    def add_row(label: str, values: list[int], end_section: bool = False) -> None:
        table.add_row(label, *map(str, values), end_section=end_section)

    for key in ("conversations", "sessions", "turns", "facts"):
        add_row(key, [split[key] for split in stats])
    for category, name in summary["categories"].items():
        add_row(f"questions {category} ({name})", [split["questions"][category] for split in stats])
    add_row("questions", [split["questions"]["total"] for split in stats], end_section=True)
    add_row("questions without evidence", [split["questions_without_evidence"] for split in stats])
    for kind in IssueKind:
        label = kind.value.replace("dia_id", "dia-id").replace("_", " ")
        add_row(label, [split[kind.value] for split in stats])
    Console().print(table)
    for issue in summary["issues"]:
        print(f"{issue['sample_id']} {issue['json_path']}: {issue['raw']!r}: {issue['detail']}")


# --- knowledge-update ---------------------------------------------------------------------------


def _configure_knowledge_update(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("data/knowledge_update.json"), help="where to write it (default: where conf/data/knowledge_update.yaml reads it)")
    parser.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0, the set conf/data/knowledge_update.yaml names)")
    from memr1.datasets.knowledge_update import DEFAULT_KINDS, KINDS

    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(DEFAULT_KINDS),
                        help=f"the kinds of change told (default: {' '.join(DEFAULT_KINDS)}, the set of record; "
                        "conf/data/knowledge_update_dropped.yaml reads all four from data/knowledge_update_dropped.json)")


def _run_knowledge_update(args: argparse.Namespace) -> int:
    from memr1.datasets.knowledge_update import write
    from memr1.datasets.locomo import parse_locomo

    write(args.out, args.seed, kinds=args.kinds)
    conversations = parse_locomo(args.out, exclude_categories=()).conversations
    by_split: dict[str, list[int]] = {}
    for conversation in conversations:
        split = conversation.sample_id.split("-")[1]
        by_split.setdefault(split, []).append(len(conversation.questions))
    sizes = ", ".join(f"{split}: {len(counts)} conversations, {sum(counts)} questions" for split, counts in by_split.items())
    print(f"wrote {args.out} (seed {args.seed}, kinds {' '.join(args.kinds)}): {sizes}")
    return 0


# --- serve ---------------------------------------------------------------------------------------


def _configure_memory(parser: argparse.ArgumentParser) -> None:
    """The options of a served `Memory`: where it lives and its agents (`serve` and `mcp`)."""
    model_help = "embedded:NAME, a HF directory, or openai:URL#MODEL; 'none' for no model"
    parser.add_argument("--path", type=Path, default=Path("memories"), help="where the memories live (Milvus Lite, default ./memories); with --uri, only an earlier layout found there is moved onto the server")
    parser.add_argument("--uri", help="another store instead of Milvus Lite: a Milvus server (http://host:port; replicas of the service share one), qdrant:DIR or qdrant+http://host:port (the qdrant extra), or :memory:")
    parser.add_argument("--model", default="embedded:smollm2-135m-instruct", help=f"the backbone of all three agents: {model_help}")
    parser.add_argument("--manager", default="none", help="the Memory Manager: 'none' (ADD every fact), 'base' (the prompted backbone), a shipped agent (trained:NAME), a trained policy/ export dir, or openai:URL#MODEL")
    parser.add_argument("--answer", default="base", help="the Answer Agent: 'base', a shipped agent (trained:NAME), a trained policy/ export dir, openai:URL#MODEL, or 'none'")
    parser.add_argument("--extractor", default="none", help="fact extraction: 'none' (each user message is a fact), 'base', or openai:URL#MODEL")
    parser.add_argument("--manager-add-text", choices=ADD_TEXTS,
                        help="what the Manager's ADD stores: 'fact' (the default: the fact as given) or 'model' (its own text, as Mem0)")
    parser.add_argument("--k", type=int, default=30, help="memories shown to the Answer Agent (the paper: 30 per speaker)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="the Answer Agent's reply budget (room to list memories)")
    parser.add_argument("--no-distill", action="store_true", help="answer directly, without listing the memories used")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="local models' compute dtype (auto: bf16 where the CPU or GPU has bf16 units)")
    parser.add_argument("--prompt-lookup", type=int,
                        help="local models: draft tokens per forward, copied from the context, when a request decodes alone "
                             "(greedy; the same answers up to float rounding; 0: token by token; default "
                             "memr1.service.models.PROMPT_LOOKUP_TOKENS)")


DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000  # this machine only


def _configure_http(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help=f"interface to listen on (default {DEFAULT_HOST}: this machine only)")
    parser.add_argument("--port", type=int, help=f"default {DEFAULT_PORT}")
    parser.add_argument("--api-key-env", help="name of an environment variable holding the API key clients must send")


def _configure_serve(parser: argparse.ArgumentParser) -> None:
    _configure_memory(parser)
    _configure_http(parser)


def _configure_mcp(parser: argparse.ArgumentParser) -> None:
    _configure_memory(parser)
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio",
                        help="stdio (a desktop agent starts this command) or http (streamable HTTP at /mcp; memr1 serve also serves it)")
    parser.add_argument("--user-id", help="the user a tool call acts for when it names none (over HTTP, also ?user_id= in the URL)")
    _configure_http(parser)


def _agent_model(choice: str, backbone: str, models: dict, **local: Any) -> Any:
    """The model of an agent `choice` over `backbone`; `local`: a local model's options (`text_model`'s)."""
    from memr1.service.models import text_model

    if choice == "none":
        return None
    if choice == "base":
        return text_model(backbone, models=models, **local)
    if choice.startswith("openai:"):
        return text_model(choice, models=models)
    if backbone.startswith("openai:"):
        raise ValueError(f"{choice!r}: a trained export runs locally; --model must be a local backbone, not {backbone}")
    if not is_shipped(choice) and not Path(choice).is_dir():
        raise ValueError(f"{choice!r}: expected 'none', 'base', a shipped agent (trained:NAME) or a policy export directory")
    return text_model(backbone, adapter=choice, models=models, **local)


def _api_key(args: argparse.Namespace) -> str | None:
    if not args.api_key_env:
        return None
    api_key = os.environ.get(args.api_key_env)
    if not api_key:
        raise ValueError(f"--api-key-env {args.api_key_env}: that environment variable is empty")
    return api_key


def _open_memory(args: argparse.Namespace) -> Any:
    from memr1.service.memory import Memory

    if args.manager_add_text and args.manager == "none":
        raise ValueError("--manager-add-text: there is no Manager (--manager none) and every fact is ADDed as given")
    models: dict = {}
    local = {"precision": args.precision, **({} if args.prompt_lookup is None else {"prompt_lookup": args.prompt_lookup})}
    return Memory(
        args.path,
        uri=args.uri,
        extractor=_agent_model(args.extractor, args.model, models, **local),
        manager=_agent_model(args.manager, args.model, models, **local),
        answerer=_agent_model(args.answer, args.model, models, **local),
        **({"add_text": args.manager_add_text} if args.manager_add_text else {}),
        k=args.k,
        distill=not args.no_distill,
        max_new_tokens=args.max_new_tokens,
    )


def _run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from memr1.service.server import create_app

    api_key = _api_key(args)
    memory = _open_memory(args)
    app = create_app(memory, chat_model=memory.answerer or memory.manager, api_key=api_key)
    try:
        uvicorn.run(app, host=args.host or DEFAULT_HOST, port=args.port or DEFAULT_PORT, log_level="info")
    finally:
        memory.close()
    return 0


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 points at stderr meanwhile: over stdio, stdout carries the protocol, and what a
    library prints while the models load (from Python or from C) must not reach the client."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _run_mcp(args: argparse.Namespace) -> int:
    from memr1.service.mcp import MemoryMCP, mcp_http_app

    if args.transport == "stdio" and (args.api_key_env or args.port is not None or args.host is not None):
        raise ValueError("--host / --port / --api-key-env: HTTP options; the stdio transport has none")
    api_key = _api_key(args)
    if args.transport == "stdio":
        with _stdout_to_stderr():
            memory = _open_memory(args)
    else:
        memory = _open_memory(args)
    try:
        server = MemoryMCP(memory, default_user_id=args.user_id)
        if args.transport == "stdio":
            server.run("stdio")  # the SDK points fd 1 at stderr while it serves, the protocol aside
        else:
            import uvicorn

            uvicorn.run(mcp_http_app(server, api_key), host=args.host or DEFAULT_HOST, port=args.port or DEFAULT_PORT, log_level="info")
    finally:
        memory.close()
    return 0


# --- the command ---------------------------------------------------------------------------------

def _configure_pipeline(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("schedule", help="a schedule of conf/pipeline (alternating, demo) or a YAML path")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE for every stage, or train.py:KEY=VALUE / evaluate.py:KEY=VALUE")
    parser.add_argument("--root", default=None, help="the schedule's directory (default: its `root`)")
    parser.add_argument("--archive", default=None, help="where finished stages are kept and restored from (default: its `archive`, if any)")
    parser.add_argument("--keep", action="store_true", help="run nothing: keep the finished stages and the running training stage's newest checkpoint in the archive")


def _run_pipeline(args: argparse.Namespace) -> int:
    from memr1.schedule import keep_progress, load_schedule, run_schedule

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    schedule = load_schedule(args.schedule, args.root, args.overrides, args.archive)
    if args.keep:
        kept = keep_progress(schedule)
        print(f"kept in {schedule.archive}: {', '.join(kept) or 'nothing new'}")
        return 0
    return run_schedule(schedule)


# --- compare -------------------------------------------------------------------------------------


def _configure_compare(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN", help="evaluation run directories (with predictions.jsonl); each after the first is compared with the first")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    parser.add_argument("--json", type=Path, help="also write the comparisons as JSON here")


def _run_compare(args: argparse.Namespace) -> int:
    from memr1.pipeline.compare import compare_runs, markdown
    from memr1.pipeline.report_file import REPORT_FILE, EvalReport

    if len(args.runs) < 2:
        raise ValueError("compare: give at least two run directories (A, then each B to set against it)")
    comparisons = [compare_runs(args.runs[0], run, args.resamples, args.seed) for run in args.runs[1:]]
    # Names a run wrote beat a guess from run A's spec: a report older than the names may say
    # data=locomo for another set in LoCoMo's format (the knowledge-update set's first rows did).
    reports = [EvalReport.read(run) for run in args.runs if (Path(run) / REPORT_FILE).is_file()]
    written = [names for report in reports if (names := report.written_category_names()) is not None]
    names: dict[int, str] = {}
    if written:
        names = written[0]
    elif reports:
        names = reports[0].category_names()
    print("\n\n".join(markdown(c, names) for c in comparisons))
    if args.json:
        args.json.write_text(json.dumps([c.to_json() for c in comparisons], indent=2))
    return 0


# --- decisions -----------------------------------------------------------------------------------


def _configure_decisions(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN", help="evaluation run directories (with decisions.jsonl); each after the first is set against the first (the reference, say the oracle)")
    parser.add_argument("--json", type=Path, help="also write the agreements as JSON here")
    parser.add_argument("--data", type=Path, help="the runs' dataset file (LoCoMo format): also count each run's "
                        "operations by the categories of the questions citing the fact (one run is then enough)")


def _run_decisions(args: argparse.Namespace) -> int:
    from memr1.datasets.locomo import load_locomo
    from memr1.pipeline.decisions import agreement, by_citation, citation_markdown, markdown, read_decisions

    if len(args.runs) < (1 if args.data else 2):
        raise ValueError("decisions: give at least two run directories (the reference, then each Manager's), or one with --data")
    reference = read_decisions(args.runs[0])
    results = []
    for run in args.runs[1:]:
        rows, left_out = agreement(reference, read_decisions(run))
        print(markdown(args.runs[0], run, rows, left_out), end="\n\n")
        results.append({"reference": args.runs[0], "run": run, "left_out": left_out, "operations": [r.to_json() for r in rows]})
    if args.data:
        conversations = load_locomo(args.data)
        for run in args.runs:
            table = by_citation(read_decisions(run), conversations)
            print(citation_markdown(run, table), end="\n\n")
            results.append({"run": run, "by_citation": table})
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


# --- agents --------------------------------------------------------------------------------------


def _configure_agents(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="the cards as JSON")


def _run_agents(args: argparse.Namespace) -> int:
    from memr1.shipped import TRAINED_PREFIX, card, shipped_agents

    cards = [card(TRAINED_PREFIX + name) for name in shipped_agents()]
    if args.json:
        print(json.dumps(cards, indent=2))
        return 0
    table = Table(title="shipped agents (use as ckpt=trained:NAME, --answer trained:NAME, ...)")
    for column in ("name", "agent", "warm start", "split", "F1", "ΔF1 vs its start [95%]", "limits (card.md)"):
        table.add_column(column, overflow="fold")  # a name cut to "trained:answer…" names no agent
    for entry in cards:
        evaluation = entry["evaluation"]
        versus = evaluation.get("versus")
        delta = "" if not versus else (
            f"{versus['overall']['f1']['delta']:+.2f} [{versus['overall']['f1']['low']:+.2f}, {versus['overall']['f1']['high']:+.2f}]"
        )
        table.add_row(TRAINED_PREFIX + entry["name"], entry["agent"], entry["warm_start"] or "-", evaluation["split"],
                      f"{evaluation['scores'].get('f1', float('nan')):.2f}", delta, str(len(entry.get("limits", []))))
    Console().print(table if cards else "no shipped agents")
    return 0


SUBCOMMANDS: list[Subcommand] = [
    Subcommand(
        name="data-summary",
        help="sizes of a LoCoMo file per split, and the dia_ids repaired or dropped while parsing it",
        configure=_configure_data_summary,
        run=_run_data_summary,
    ),
    Subcommand(
        name="knowledge-update",
        help="write the synthetic knowledge-update set (facts replaced, cancelled, accumulated; dropped with --kinds) in LoCoMo's format",
        configure=_configure_knowledge_update,
        run=_run_knowledge_update,
    ),
    Subcommand(
        name="serve",
        help="the memory service: Mem0's REST routes, /answer and /v1/chat/completions over memr1 banks",
        configure=_configure_serve,
        run=_run_serve,
    ),
    Subcommand(
        name="mcp",
        help="the memory as MCP tools (add_memories, search_memory, answer, ...) over stdio or streamable HTTP",
        configure=_configure_mcp,
        run=_run_mcp,
    ),
    Subcommand(
        name="compare",
        help="paired comparison of evaluation runs: ΔF1 / ΔBLEU-1 / ΔEM with 95% bootstrap intervals and a verdict",
        configure=_configure_compare,
        run=_run_compare,
    ),
    Subcommand(
        name="decisions",
        help="the Manager's decisions of evaluation runs against a reference's, fact by fact: precision and recall per operation",
        configure=_configure_decisions,
        run=_run_decisions,
    ),
    Subcommand(
        name="agents",
        help="the trained agents shipped with memr1 (trained:NAME), with what they score",
        configure=_configure_agents,
        run=_run_agents,
    ),
    Subcommand(
        name="pipeline",
        help="a multi-stage schedule (SFT, RL, evaluations) as one resumable command: memr1 pipeline alternating",
        configure=_configure_pipeline,
        run=_run_pipeline,
    ),
]


#: The Hydra apps, run with their own command line (Hydra's overrides, `--cfg job`, `--help`).
HYDRA_APPS = {"train": "memr1.apps.train", "evaluate": "memr1.apps.evaluate"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memr1",
        description="Memory-R1 tools.",
        epilog="Training and evaluation: memr1 train [OVERRIDES] and memr1 evaluate [OVERRIDES], the Hydra "
        "apps of memr1/conf (train.py and evaluate.py in a checkout); memr1 train --help lists their options.",
    )
    subparsers = parser.add_subparsers(title="commands", dest="command", required=True)
    for subcommand in SUBCOMMANDS:
        # argparse %-formats a help string (a bare "95%" raises ValueError) and prints a description as is.
        subparser = subparsers.add_parser(subcommand.name, help=subcommand.help.replace("%", "%%"), description=subcommand.help)
        subcommand.configure(subparser)
        subparser.set_defaults(run=subcommand.run)
    return parser


def run_hydra_app(name: str, overrides: Sequence[str]) -> int:
    """`memr1 train ...` as `python train.py ...`: Hydra reads the command line itself, and exits 1 on
    a failed run."""
    app = importlib.import_module(HYDRA_APPS[name])
    sys.argv = [f"memr1 {name}", *overrides]
    app.main()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in HYDRA_APPS:
        return run_hydra_app(argv[0], argv[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse gives a positional list only the words before the first option: `pipeline NAME --root
    # DIR a=b` leaves a=b over, which are overrides as much as those before --root.
    if extra and (args.command != "pipeline" or any(word.startswith("-") for word in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return args.run(args)
    except (OSError, ValueError) as error:
        print(f"memr1 {args.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
