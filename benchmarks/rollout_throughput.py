"""Rollout throughput of the `hf` generation engine (memr1.llm.engines.HFEngine) on the embedded
SmolLM2-135M-Instruct, by batch size and group size, beside a plain `model.generate` loop and the
machine's roofline.

A batch of b rows with group size G (`--group-sizes`, GRPO's samples per prompt) is b/G distinct
Answer-Agent prompts (`AnswerAgent.build_messages` over synthetic memories of two speakers, ~440 prompt
tokens each) x G samples; batch sizes not divisible by G are skipped. G=1 is the plain case (b distinct
prompts); G>1 shows the engine prefilling each distinct prompt once and copying its KV cache to its G
samples. Sampling is at temperature 1.0, top-p 1.0 with a fixed seed, up to `--max-new-tokens`. Rows
that emit EOS stop early, so throughput counts the tokens actually produced (EOS included); "total"
counts prompt + generated tokens, each distinct prompt once. Tokens/s are summed over the repeats
(tokens / seconds); "p50 s/batch" is the median time of one call.

- engine: `build_engine("hf", batch_size=b).generate(prompts, SamplingConfig(n=G, ...))`, one batch of
  b rows (b/G prompts).
- generate(): `model.generate` on the same left-padded prompt ids (b/G of them) with
  `num_return_sequences=G`, do_sample, top_k 0 (transformers would otherwise apply its default top-k 50),
  same max_new_tokens and EOS ids, global seed. transformers expands the prompts to b rows before the
  prefill, so it prefills every row: the G>1 rows show what sharing the prefill buys.
  Engine and generate() alternate inside each repeat, so load swings hit both.
  "engine / generate()" = ratio of their generated tok/s (above 1: the engine is faster).
- roofline, measured in the same run with the model's torch thread count: FLOP/s of a float32
  2048x2048 @ 2048x2048 matmul, and memory bandwidth of copying a 256 MB float32 tensor into a
  preallocated one (bytes read + bytes written per second; a fresh clone would mostly time page faults).
  n = every weight a decode token passes through a matmul: the blocks' linear layers plus the LM head
  (the tied embedding matrix; the embedding lookup itself is free), 134.5M for SmolLM2-135M.
  Per decode token, compute = 2n FLOPs + attention (4 x layers x heads x head_dim x context); per
  decode step, memory = 4n bytes of fp32 weights + the KV cache of every row.
  "compute-bound" = FLOP/s / FLOPs per decode token; "bandwidth-bound" = b x bandwidth / bytes per
  step (both decode-only, at the run's mean context). "engine % of bound" = ideal time / mean engine
  time, where the ideal time for the exact work of the batch (the engine's own token counts) is its
  prefill FLOPs / FLOP/s (the b/G distinct prompts' tokens; the LM head on each prompt's last token
  only, as the engine does) plus, for every decode step over all b rows, the slower of its compute and
  its memory traffic: prefill is compute-bound, decode takes min(compute-bound, bandwidth-bound) tok/s.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rollout_throughput.py --quick      # b 4 x G 1 4, ~1-2 min
    .venv/bin/python benchmarks/rollout_throughput.py --out rollout_throughput.json   # b 1 4 8 16 x G 1 4, 64 tok
    .venv/bin/python benchmarks/rollout_throughput.py --batch-sizes 8 --group-sizes 1 8 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from transformers import PreTrainedModel  # noqa: E402

from memr1.agents.answer import AnswerAgent  # noqa: E402
from memr1.llm.engines import ChatMessages, HFEngine, encode_prompts  # noqa: E402
from memr1.factories import build_engine  # noqa: E402
from memr1.llm.loading import load_policy  # noqa: E402
from memr1.llm.padding import left_pad  # noqa: E402
from memr1.llm.sampling import SamplingConfig  # noqa: E402
from memr1.types import MemoryEntry  # noqa: E402
from machine import machine_info, print_machine  # noqa: E402  (benchmarks/machine.py, beside this script)

MODEL = "embedded:smollm2-135m-instruct"
SPEAKERS = ("Caroline", "Melanie")
MEMORIES_PER_SPEAKER = 4  # ~440 prompt tokens with SmolLM2's tokenizer
BYTES_PER_FLOAT = 4  # the model runs in float32 on CPU
MATMUL_SIZE = 2048
COPY_MEGABYTES = 256

# Synthetic memories: a subject-free event and a time, so each speaker gets plausible LoCoMo-like lines.
EVENTS = (
    "went to a support group meeting for transgender people and felt welcomed by everyone there",
    "painted a sunrise over the lake and plans to show it at the local community art fair",
    "ran a charity race to raise awareness for mental health together with three colleagues",
    "started researching adoption agencies because she wants to build a family of her own",
    "took her kids camping in the mountains, where they roasted marshmallows and watched meteors",
    "signed up for a pottery class on Thursday evenings and made a blue bowl in the first session",
    "moved from Sweden four years ago and still keeps in touch with her friends from home",
    "is reading a book about resilience that her mentor recommended after a hard month at work",
    "went to a concert of her favourite band with her husband and sang along to every song",
    "volunteered at an LGBTQ youth center and gave a short talk about her own coming-out story",
    "bought a new violin after practising on her grandmother's old one for more than ten years",
    "visited the beach with her family and found a rare shell that she now keeps on her desk",
    "is planning a road trip along the coast next summer with her best friend from college",
    "adopted a cat from the shelter and named it Oliver after her favourite childhood book",
)
TIMES = ("1:56 pm on 8 May, 2023", "7:55 pm on 25 May, 2023", "10:37 am on 27 June, 2023",
         "1:36 pm on 3 July, 2023", "8:18 pm on 6 July, 2023", "4:33 pm on 12 July, 2023",
         "1:51 pm on 15 July, 2023", "3:31 pm on 23 August, 2023", "11:08 am on 13 September, 2023")
QUESTIONS = (
    "When did Caroline go to the LGBTQ support group?",
    "What did Melanie paint recently?",
    "Where did Caroline move from four years ago?",
    "What activities does Melanie do with her family?",
    "What is Caroline planning to do about starting a family?",
    "When did Melanie run the charity race?",
    "What instrument does Caroline play?",
    "What did Melanie find at the beach?",
)


def answer_prompts(count: int, seed: int) -> list[ChatMessages]:
    """`count` distinct Answer-Agent prompts (system + user messages) over synthetic memories."""
    rng = random.Random(seed)
    agent = AnswerAgent(distill=True)
    prompts = []
    for index in range(count):
        memories = {
            speaker: [
                MemoryEntry(id=f"{index}-{speaker}-{slot}", text=f"{speaker} {event}", speaker=speaker,
                            timestamp=rng.choice(TIMES))
                for slot, event in enumerate(rng.sample(EVENTS, MEMORIES_PER_SPEAKER))
            ]
            for speaker in SPEAKERS
        }
        prompts.append(agent.build_messages(QUESTIONS[index % len(QUESTIONS)], memories))
    return prompts


# ---- roofline -----------------------------------------------------------------------------------


def matmul_flops_per_s(size: int = MATMUL_SIZE, reps: int = 3) -> float:
    """FLOP/s of a float32 size x size @ size x size matmul (best of `reps`, after one warm-up)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = min(_seconds(lambda: torch.mm(a, b)) for _ in range(reps))
    return 2 * size**3 / best


def copy_bytes_per_s(megabytes: int = COPY_MEGABYTES, reps: int = 3) -> float:
    """Memory traffic of copying a float32 tensor into another: (bytes read + bytes written) / s, best
    of `reps`. The destination is allocated (and touched) once: a fresh `clone` would time the page
    faults of its new allocation, not the memory bus."""
    source = torch.ones(megabytes * 2**20 // BYTES_PER_FLOAT)
    destination = torch.empty_like(source)
    destination.copy_(source)
    best = min(_seconds(lambda: destination.copy_(source)) for _ in range(reps))
    return 2 * megabytes * 2**20 / best


def _seconds(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs of a Llama-style decoder."""

    block_linear_params: int  # weights of the blocks' linear layers (attention + MLP)
    lm_head_params: int  # the LM head (SmolLM2 ties it to the embedding matrix)
    layers: int
    attention_width: int  # heads x head_dim: FLOPs of q.k and p.v per context position per layer
    kv_width: int  # kv_heads x head_dim: one token's keys (or values) per layer

    @classmethod
    def of(cls, model: PreTrainedModel) -> ModelShape:
        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        linear = sum(
            module.weight.numel() for module in model.model.modules() if isinstance(module, torch.nn.Linear)
        )
        return cls(
            block_linear_params=linear,
            lm_head_params=model.lm_head.weight.numel(),
            layers=config.num_hidden_layers,
            attention_width=config.num_attention_heads * head_dim,
            kv_width=config.num_key_value_heads * head_dim,
        )

    @property
    def matmul_params(self) -> int:
        """n: weights a decode token passes through a matmul (blocks + LM head)."""
        return self.block_linear_params + self.lm_head_params

    def decode_flops(self, context: int) -> float:
        """One decode token attending to `context` positions."""
        return 2 * self.matmul_params + 4 * self.layers * self.attention_width * context

    def prefill_flops(self, prompt_length: int) -> float:
        """One row's prefill: causal attention over 1..L positions, the LM head on the last token only."""
        attention = 4 * self.layers * self.attention_width * prompt_length * (prompt_length + 1) / 2
        return 2 * self.block_linear_params * prompt_length + attention + 2 * self.lm_head_params

    def decode_step_bytes(self, contexts: Sequence[int]) -> float:
        """One decode step: every weight once, plus the keys and values of each row's context."""
        kv = sum(2 * self.layers * self.kv_width * context for context in contexts)
        return BYTES_PER_FLOAT * (self.matmul_params + kv)


def ideal_seconds(
    shape: ModelShape,
    prompt_lengths: list[int],
    generated: list[int],
    group_size: int,
    flops: float,
    bandwidth: float,
) -> float:
    """Lower bound on the time of this batch's work: compute-bound prefill of each distinct prompt
    (`prompt_lengths`; its logits give the first token of its `group_size` rows), then each decode step
    at the slower of its compute and its memory traffic, over the rows still generating. `generated`
    is per row, prompt-major (a prompt's G samples side by side)."""
    total = sum(shape.prefill_flops(length) for length in prompt_lengths) / flops
    row_lengths = [length for length in prompt_lengths for _ in range(group_size)]
    for step in range(1, max(generated)):
        contexts = [length + step for length, count in zip(row_lengths, generated, strict=True) if count > step]
        compute = sum(shape.decode_flops(context) for context in contexts) / flops
        total += max(compute, shape.decode_step_bytes(contexts) / bandwidth)
    return total


# ---- timed generation ---------------------------------------------------------------------------


def run_engine(engine: HFEngine, prompts: list[ChatMessages], sampling: SamplingConfig) -> tuple[float, list[int]]:
    """Seconds for one `engine.generate` call and the tokens each row produced (prompt-major)."""
    start = time.perf_counter()
    generations = engine.generate(prompts, sampling)
    seconds = time.perf_counter() - start
    return seconds, [len(sample.response_ids) for samples in generations for sample in samples]


def run_generate(
    model: PreTrainedModel, prompt_ids: list[list[int]], sampling: SamplingConfig, pad_id: int, eos_ids: list[int]
) -> tuple[float, list[int]]:
    """Seconds for one `model.generate` call on the left-padded prompts, `sampling.n` sequences each, and
    the tokens each row produced (up to and including its first EOS: later columns are padding)."""
    input_ids, attention_mask = left_pad(prompt_ids, pad_id)
    torch.manual_seed(sampling.seed)
    start = time.perf_counter()
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=0,
            max_new_tokens=sampling.max_new_tokens,
            num_return_sequences=sampling.n,
            pad_token_id=pad_id,
            eos_token_id=eos_ids,
        )
    seconds = time.perf_counter() - start
    produced = []
    for row in output[:, input_ids.shape[1] :].tolist():
        ends = [position for position, token in enumerate(row) if token in eos_ids]
        produced.append(ends[0] + 1 if ends else len(row))
    return seconds, produced


def run_batch_size(
    model: PreTrainedModel,
    engine: HFEngine,
    prompts: list[ChatMessages],
    sampling: SamplingConfig,
    repeats: int,
    shape: ModelShape,
    flops: float,
    bandwidth: float,
) -> dict:
    prompt_ids = encode_prompts(engine.tokenizer, prompts)
    prompt_lengths = [len(ids) for ids in prompt_ids]
    eos_ids = sorted(engine.eos_token_ids)
    engine_runs, generate_runs = [], []
    for _ in range(repeats):  # alternate the two so that load swings hit both alike
        engine_runs.append(run_engine(engine, prompts, sampling))
        generate_runs.append(run_generate(model, prompt_ids, sampling, engine.tokenizer.pad_token_id, eos_ids))

    def summary(runs: list[tuple[float, list[int]]]) -> dict:
        seconds = [run[0] for run in runs]
        generated = sum(sum(run[1]) for run in runs)
        return {
            "p50_s": statistics.median(seconds),
            "seconds": seconds,
            "generated_tokens_per_run": [sum(run[1]) for run in runs],
            "gen_tok_per_s": generated / sum(seconds),
            "total_tok_per_s": (generated + repeats * sum(prompt_lengths)) / sum(seconds),
        }

    group_size = sampling.n
    batch = len(prompts) * group_size
    mean_context = statistics.mean(prompt_lengths) + sampling.max_new_tokens / 2
    # The engine's own token counts (it samples from its own generator) fix the work it had to do.
    ideal = statistics.mean(
        ideal_seconds(shape, prompt_lengths, produced, group_size, flops, bandwidth)
        for _, produced in engine_runs
    )
    engine_stats, generate_stats = summary(engine_runs), summary(generate_runs)
    return {
        "batch": batch,
        "group_size": group_size,
        "distinct_prompts": len(prompts),
        "prompt_tokens_mean": statistics.mean(prompt_lengths),
        "engine": engine_stats,
        "generate": generate_stats,
        "engine_over_generate": engine_stats["gen_tok_per_s"] / generate_stats["gen_tok_per_s"],
        "compute_bound_decode_tok_per_s": flops / shape.decode_flops(round(mean_context)),
        "bandwidth_bound_decode_tok_per_s": batch * bandwidth
        / shape.decode_step_bytes([round(mean_context)] * batch),
        "prefill_bound_tok_per_s": flops * sum(prompt_lengths)
        / sum(shape.prefill_flops(length) for length in prompt_lengths),
        "ideal_s": ideal,
        "engine_fraction_of_bound": ideal / statistics.mean(run[0] for run in engine_runs),
    }


# ---- report -------------------------------------------------------------------------------------


def render(results: list[dict], max_new_tokens: int, threads: int) -> Table:
    table = Table(title=f"HF engine rollouts: {MODEL}, fp32, {max_new_tokens} new tokens, {threads} torch threads")
    for column in ("batch", "G", "prompt tok", "engine gen tok/s", "engine total tok/s", "generate() gen tok/s",
                   "engine / generate()", "compute-bound tok/s", "bandwidth-bound tok/s", "engine % of bound",
                   "engine p50 s/batch"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            str(r["batch"]),
            str(r["group_size"]),
            f"{r['prompt_tokens_mean']:.0f}",
            f"{r['engine']['gen_tok_per_s']:.1f}",
            f"{r['engine']['total_tok_per_s']:.0f}",
            f"{r['generate']['gen_tok_per_s']:.1f}",
            f"{r['engine_over_generate']:.2f}x",
            f"{r['compute_bound_decode_tok_per_s']:.0f}",
            f"{r['bandwidth_bound_decode_tok_per_s']:.0f}",
            f"{r['engine_fraction_of_bound']:.0%}",
            f"{r['engine']['p50_s']:.2f}",
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--group-sizes", type=int, nargs="+", default=[1, 4], metavar="G",
                        help="samples per distinct prompt (GRPO's group); each batch size runs with each G")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per batch size, of each generator")
    parser.add_argument("--quick", action="store_true", help="batch size 4, G 1 4, 16 new tokens, 1 repeat")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: leave torch's setting)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    if args.quick:
        args.batch_sizes, args.group_sizes, args.max_new_tokens, args.repeats = [4], [1, 4], 16, 1
    if min(args.batch_sizes + args.group_sizes) < 1 or args.max_new_tokens < 1 or args.repeats < 1:
        parser.error("--batch-sizes, --group-sizes, --max-new-tokens and --repeats must be positive")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    console = Console(width=180)
    print_machine()
    load_before = os.getloadavg()[0]  # timings on a shared machine move with its load: keep it beside them
    model, tokenizer = load_policy(MODEL)
    shape = ModelShape.of(model)
    console.log("measuring the roofline (matmul FLOP/s, copy bandwidth) ...")
    flops, bandwidth = matmul_flops_per_s(), copy_bytes_per_s()
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0, seed=args.seed)

    # Warm-up: the first forward passes pay one-off allocation and kernel selection costs (for G>1 also
    # the KV cache copy and transformers' prompt expansion).
    warm_prompts = answer_prompts(1, args.seed)
    for group_size in sorted(set(args.group_sizes)):
        warm_sampling = SamplingConfig(max_new_tokens=2, n=group_size, seed=args.seed)
        warm_engine = build_engine("hf", model=model, tokenizer=tokenizer, batch_size=group_size)
        run_engine(warm_engine, warm_prompts, warm_sampling)
        run_generate(model, encode_prompts(tokenizer, warm_prompts), warm_sampling, tokenizer.pad_token_id,
                     sorted(warm_engine.eos_token_ids))

    results = []
    for batch in args.batch_sizes:
        for group_size in args.group_sizes:
            if batch % group_size:
                console.log(f"batch {batch}, G {group_size}: skipped (batch not divisible by G)")
                continue
            console.log(f"batch {batch}, G {group_size} ...")
            engine = build_engine("hf", model=model, tokenizer=tokenizer, batch_size=batch)
            prompts = answer_prompts(batch // group_size, args.seed)
            group_sampling = replace(sampling, n=group_size)
            results.append(
                run_batch_size(model, engine, prompts, group_sampling, args.repeats, shape, flops, bandwidth)
            )
    load_after = os.getloadavg()[0]

    threads = torch.get_num_threads()
    console.print(render(results, args.max_new_tokens, threads))
    console.print(
        f"matmul {flops / 1e9:.1f} GFLOP/s, copy {bandwidth / 1e9:.1f} GB/s (read + write); "
        f"n = {shape.matmul_params / 1e6:.1f}M matmul weights per token "
        f"({shape.block_linear_params / 1e6:.1f}M blocks + {shape.lm_head_params / 1e6:.1f}M LM head); "
        f"{os.cpu_count()} CPUs, 1-min load average {load_before:.2f} before, {load_after:.2f} after"
    )
    if args.out:
        machine = machine_info(load_before, load_after, transformers=transformers.__version__)
        roofline = {
            "matmul_flops_per_s": flops,
            "matmul_size": MATMUL_SIZE,
            "copy_bytes_per_s": bandwidth,
            "copy_megabytes": COPY_MEGABYTES,
            "n_matmul_params": shape.matmul_params,
            "block_linear_params": shape.block_linear_params,
            "lm_head_params": shape.lm_head_params,
        }
        settings = {"model": MODEL, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                    "batch_sizes": args.batch_sizes, "group_sizes": args.group_sizes,
                    "seed": args.seed, "temperature": 1.0, "top_p": 1.0,
                    "memories_per_speaker": MEMORIES_PER_SPEAKER}
        report = {"machine": machine, "settings": settings, "roofline": roofline, "results": results}
        args.out.write_text(json.dumps(report, indent=2))
        console.log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
