"""Where evaluation's time goes, and how far each part is from the machine's limit, in one run.

On LoCoMo's validation questions with the evaluation's settings (the embedded SmolLM2-135M, k memories
per speaker, greedy, `--max-new-tokens`), through the pipeline's own engine:

- the prompts: their length, and the longest prefix every prompt shares (what a prefix KV cache could
  skip computing);
- the matmul peak of this machine at the prefill's shapes (M = batch x prompt tokens, K and N the
  model's), fp32 and bf16, measured here;
- one prefill forward of `--batch` prompts: seconds, and the GFLOP/s its linear layers achieve (2 x
  non-embedding parameters x tokens per second), beside that peak;
- generation at each `--batch-sizes`: prefill alone (`max_new_tokens=1`) and the whole answer, so that
  decode = whole - prefill; questions a minute.

    .venv/bin/python benchmarks/eval_profile.py --out docs/bench/eval_profile.json
    .venv/bin/python benchmarks/eval_profile.py --precision bf16 --no-distill --questions 24
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import ExitStack
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from eval_throughput import SPLIT, evaluation_config, open_built_banks  # noqa: E402  (beside this script)
from machine import machine_info, print_machine  # noqa: E402
from memr1.agents.answer import AnswerAgent  # noqa: E402
from memr1.embed import Embedder  # noqa: E402
from memr1.factories import build_engine, frozen_policy  # noqa: E402
from memr1.llm.engines import encode_prompts  # noqa: E402
from memr1.llm.precision import choose_precision  # noqa: E402
from memr1.llm.sampling import SamplingConfig  # noqa: E402
from memr1.memory.retrieval import retrieve_memories  # noqa: E402
from memr1.pipeline.evaluation import load_split, select_questions  # noqa: E402


def matmul_gflops(m: int, k: int, n: int, dtype: torch.dtype, repeats: int = 5) -> float:
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    a @ b  # warm-up: the first call picks and packs kernels
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * m * k * n * repeats / (time.perf_counter() - started) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=48)
    parser.add_argument("--k-per-speaker", type=int, default=5, help="the CPU lift's evaluation setting (paper 30)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="prompts in the single prefill forward")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--precision", choices=("fp32", "bf16", "auto"), default="fp32")
    parser.add_argument("--no-distill", action="store_true", help="the agent that answers without listing memories")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    print_machine()
    load_before = os.getloadavg()[0]
    cfg = evaluation_config()
    conversations = load_split(cfg.data, SPLIT, None)
    model, tokenizer = frozen_policy(cfg.backbone.name_or_path, cfg.backbone.dtype, None)
    precision = choose_precision(args.precision, "cpu")
    agent = AnswerAgent(distill=not args.no_distill, max_answer_words=cfg.answer.max_answer_words)
    with ExitStack() as stack:
        banks, _ = open_built_banks(cfg, conversations, Embedder(), stack)
        speakers = {c.sample_id: c.speakers for c in conversations}
        questions = select_questions(conversations, args.questions)
        prompts = [agent.build_messages(q.question, retrieve_memories(banks[q.conversation_id], q.question, speakers[q.conversation_id], args.k_per_speaker))
                   for q in questions]
    ids = encode_prompts(tokenizer, prompts)
    lengths = [len(i) for i in ids]
    shared = len(os.path.commonprefix([tuple(i) for i in ids]))
    config = model.config
    tokens = args.batch * round(sum(lengths) / len(lengths))
    peak = {
        name: max(matmul_gflops(tokens, config.hidden_size, n, dtype) for n in (config.hidden_size, config.intermediate_size))
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
    }
    linear_params = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n and "lm_head" not in n)
    batch_ids = torch.tensor([i[: min(lengths)] for i in ids[: args.batch]])
    with torch.no_grad(), precision.autocast("cpu"):
        model(input_ids=batch_ids[:, :8], logits_to_keep=1)
        started = time.perf_counter()
        model(input_ids=batch_ids, logits_to_keep=1)
        prefill_s = time.perf_counter() - started
    prefill_gflops = 2 * linear_params * batch_ids.numel() / prefill_s / 1e9

    rows = []
    for batch_size in args.batch_sizes:
        engine = build_engine("hf", model=model, tokenizer=tokenizer, batch_size=batch_size, precision=precision)
        engine.generate(prompts[:1], SamplingConfig(max_new_tokens=2, temperature=0.0))
        started = time.perf_counter()
        engine.generate(prompts, SamplingConfig(max_new_tokens=1, temperature=0.0))
        prefill_only = time.perf_counter() - started
        started = time.perf_counter()
        outputs = engine.generate(prompts, SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.0))
        whole = time.perf_counter() - started
        rows.append({"batch": batch_size, "prefill_s": prefill_only, "whole_s": whole, "decode_s": whole - prefill_only,
                     "questions_per_min": 60 * len(prompts) / whole,
                     "response_tokens_mean": sum(len(o[0].response_ids) for o in outputs) / len(outputs),
                     "answers": [o[0].text for o in outputs]})
    base = rows[0]
    for row in rows:
        row["same_answers_as_first"] = sum(a == b for a, b in zip(row["answers"], base["answers"]))

    console = Console(width=150)
    console.print(f"prompts: {len(prompts)}, {min(lengths)}-{max(lengths)} tokens (mean {sum(lengths) / len(lengths):.0f}); "
                  f"shared prefix {shared} tokens ({shared / (sum(lengths) / len(lengths)):.0%} of a mean prompt)")
    console.print(f"matmul peak at the prefill's shapes (M={tokens}): fp32 {peak['fp32']:.0f} GFLOP/s, bf16 {peak['bf16']:.0f} GFLOP/s")
    console.print(f"one prefill forward, {args.batch} x {batch_ids.shape[1]} tokens, {precision.name}: {prefill_s:.2f} s, "
                  f"{prefill_gflops:.0f} GFLOP/s in its linear layers ({prefill_gflops / peak['fp32' if precision.is_fp32 else 'bf16']:.0%} of the peak)")
    table = Table(title=f"{len(prompts)} {SPLIT} questions, {precision.name}, {'no-distill' if args.no_distill else 'distilling'} prompt, <= {args.max_new_tokens} new tokens")
    for column in ("batch", "prefill s", "decode s", "whole s", "questions/min", "response tokens", "answers = first row's"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(str(row["batch"]), f"{row['prefill_s']:.1f}", f"{row['decode_s']:.1f}", f"{row['whole_s']:.1f}",
                      f"{row['questions_per_min']:.1f}", f"{row['response_tokens_mean']:.1f}", f"{row['same_answers_as_first']}/{len(prompts)}")
    console.print(table)
    if args.out:
        report = {
            "settings": {**vars(args), "out": str(args.out), "precision": precision.name},
            "prompts": {"count": len(prompts), "min": min(lengths), "max": max(lengths), "mean": sum(lengths) / len(lengths), "shared_prefix": shared},
            "matmul_peak_gflops": peak, "prefill_forward": {"batch": args.batch, "tokens": batch_ids.shape[1], "seconds": prefill_s, "gflops": prefill_gflops},
            "generation": [{key: value for key, value in row.items() if key != "answers"} for row in rows],
            "machine": machine_info(load_before, os.getloadavg()[0]),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
