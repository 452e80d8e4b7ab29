"""A served memory told a fact and then its correction: does it answer with the correction, and what did
its Manager write? Each case runs in its own scope of one `memr1.Memory` (the object `memr1 serve`
serves): two unrelated facts, the original fact, its correction, then the question. The cases are
written here, not drawn from the knowledge-update generator: other names, other subjects, other wording
(memr1/datasets/knowledge_update.py owns the set's templates).

    .venv/bin/python scripts/correction_check.py --manager trained:manager-ku-k1 \\
        --answer results/manager_ku_answerer/answer-ku-sft/policy/last --k 1 \\
        --out results/manager/correction_check_manager_ku_k1_k1.json

The question is asked twice, before the correction is told and after. A case counts as answered with
the correction when the answer holds the new value and not the old (replaced), both values
(accumulated), or a refusal of the old state (cancelled: the answer says no /
not / cancelled / quit). Greedy, in the precision asked (fp32 for rows of record).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine import machine_info, print_machine  # noqa: E402  (benchmarks/machine.py)
from memr1.service.memory import Memory  # noqa: E402
from memr1.service.models import EMBEDDED_DEFAULT, text_model  # noqa: E402

CANCELLED_ANSWER = re.compile(r"\b(no|not|cancel\w*|quit|stopped|none)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Case:
    kind: str  # "replaced", "accumulated" or "cancelled"
    fact: str
    correction: str
    question: str
    old: str  # the value the correction retires (replaced) or keeps (accumulated)
    new: str  # the value it brings ("" for cancelled)
    chatter: tuple[str, str]


CASES = (
    Case("replaced", "Marta lives in Denver.", "Marta relocated to Portland in March.", "Where does Marta live?",
         "Denver", "Portland", ("Marta enjoys hiking on weekends.", "Marta's favourite food is ramen.")),
    Case("replaced", "Tobias works as a pharmacist.", "Tobias left pharmacy and is now a software tester.",
         "What is Tobias's job?", "pharmacist", "software tester", ("Tobias has two sisters.", "Tobias likes chess.")),
    Case("replaced", "Priya's dentist appointment is on Tuesday.", "Priya's dentist appointment was moved to Friday.",
         "When is Priya's dentist appointment?", "Tuesday", "Friday", ("Priya reads mystery novels.", "Priya grows tomatoes.")),
    Case("replaced", "Jonas owns a Honda Civic.", "Jonas sold the Civic and bought a Subaru Outback.",
         "What car does Jonas own?", "Civic", "Subaru", ("Jonas coaches youth soccer.", "Jonas drinks green tea.")),
    Case("replaced", "Aiko's manager is named Frank.", "Aiko's new manager is Olga since Frank retired.",
         "Who is Aiko's manager?", "Frank", "Olga", ("Aiko paints watercolours.", "Aiko has a balcony garden.")),
    Case("replaced", "Lucas supports the Chicago Bulls.", "Lucas switched his loyalty to the Boston Celtics.",
         "Which team does Lucas support?", "Bulls", "Celtics", ("Lucas bakes bread.", "Lucas is saving for a boat.")),
    Case("replaced", "Greta's phone number ends in 4421.", "Greta got a new phone number ending in 9087.",
         "What does Greta's phone number end in?", "4421", "9087", ("Greta plays tennis.", "Greta's cousin lives in Rome.")),
    Case("replaced", "Rahul is learning the violin.", "Rahul gave up the violin and is learning the cello instead.",
         "Which instrument is Rahul learning?", "violin", "cello", ("Rahul collects stamps.", "Rahul walks to work.")),
    Case("accumulated", "Sofia has a cat named Pepper.", "Sofia adopted a second cat, named Mochi.",
         "What are the names of Sofia's cats?", "Pepper", "Mochi", ("Sofia volunteers at a library.", "Sofia likes jazz.")),
    Case("accumulated", "Daniel speaks Portuguese.", "Daniel now also speaks Korean.", "Which languages does Daniel speak?",
         "Portuguese", "Korean", ("Daniel runs marathons.", "Daniel's favourite colour is green.")),
    Case("accumulated", "Helen has visited Peru.", "Helen has also visited Norway now.", "Which countries has Helen visited?",
         "Peru", "Norway", ("Helen knits scarves.", "Helen teaches history.")),
    Case("cancelled", "Omar is planning a trip to Iceland in June.", "Omar called off his Iceland trip.",
         "Is Omar still going to Iceland?", "Iceland", "", ("Omar builds model trains.", "Omar dislikes coffee.")),
    Case("cancelled", "Lena takes a weekly pottery class.", "Lena dropped out of her pottery class.",
         "Is Lena still taking the pottery class?", "pottery", "", ("Lena rides a scooter.", "Lena has a brother.")),
    Case("cancelled", "Victor subscribes to a wine club.", "Victor ended his wine club subscription.",
         "Is Victor still subscribed to the wine club?", "wine club", "", ("Victor swims daily.", "Victor studies law.")),
)


def answered_with_correction(case: Case, answer: str) -> bool:
    text = answer.lower()
    if case.kind == "replaced":
        return case.new.lower() in text and case.old.lower() not in text
    if case.kind == "accumulated":
        return case.new.lower() in text and case.old.lower() in text
    return CANCELLED_ANSWER.search(answer) is not None


def run_case(memory: Memory, case: Case, scope: str) -> dict:
    """Tell `memory` the case under user `scope`, ask its question, and say what was written."""
    for text in (case.chatter[0], case.fact, case.chatter[1]):
        memory.add(text, user_id=scope)
    before = memory.answer(case.question, user_id=scope)
    told = memory.add(case.correction, user_id=scope)["results"]
    reply = memory.answer(case.question, user_id=scope)
    histories = {
        result["id"]: memory.history(result["id"]) for result in told if result["event"] in ("UPDATE", "DELETE") and result["id"]
    }
    return {
        **asdict(case),
        "correction_events": [result["event"] for result in told],
        "correction_results": told,
        "histories": histories,
        "answer_before_correction": before["answer"],
        "answer": reply["answer"],
        "format_error": reply["format_error"],
        "memories_shown": [item["memory"] for item in reply["memories"]],
        "answered_with_correction": answered_with_correction(case, reply["answer"]),
        # the same test of the answer given before the correction was told: a case whose answer passes
        # it already (an answerer that says "no" to every yes / no question) measures nothing
        "passed_before_correction": answered_with_correction(case, before["answer"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manager", help="the Manager's adapter: trained:NAME or a policy export dir (default: none, ADD every fact)")
    parser.add_argument("--answer", required=True, help="the Answer Agent's adapter: trained:NAME or a policy export dir")
    parser.add_argument("--k", type=int, default=1, help="memories the Answer Agent reads (memr1 serve --k)")
    parser.add_argument("--distill", action="store_true", help="a distilling Answer Agent (default: answers directly)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "auto"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print_machine()
    load_before, started = os.getloadavg()[0], time.perf_counter()
    models: dict = {}
    manager = text_model(EMBEDDED_DEFAULT, args.manager, models, args.precision) if args.manager else None
    answerer = text_model(EMBEDDED_DEFAULT, args.answer, models, args.precision)
    rows = []
    with tempfile.TemporaryDirectory() as path, Memory(path, manager=manager, answerer=answerer, k=args.k, distill=args.distill) as memory:
        for number, case in enumerate(CASES):
            rows.append(run_case(memory, case, f"case-{number}"))
            row = rows[-1]
            print(f"{case.kind:11s} {'/'.join(row['correction_events']):8s} {'yes' if row['answered_with_correction'] else 'no ':3s} "
                  f"{case.question} {row['answer_before_correction']!r} -> {row['answer']!r}", flush=True)
    summary = {
        "cases": len(rows),
        "answered_with_correction": sum(row["answered_with_correction"] for row in rows),
        "passed_before_correction": sum(row["passed_before_correction"] for row in rows),
        "by_kind": {
            kind: {"cases": sum(row["kind"] == kind for row in rows),
                   **{key: sum(row[key] for row in rows if row["kind"] == kind)
                      for key in ("answered_with_correction", "passed_before_correction")}}
            for kind in ("replaced", "accumulated", "cancelled")
        },
        "correction_events": dict(Counter(event for row in rows for event in row["correction_events"])),
    }
    print(json.dumps(summary))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": " ".join(sys.argv),
        "settings": {"manager": args.manager, "answer": args.answer, "k": args.k, "distill": args.distill, "precision": args.precision},
        "summary": summary,
        "seconds": round(time.perf_counter() - started, 1),
        "machine": machine_info(load_before, os.getloadavg()[0]),
        "rows": rows,
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
