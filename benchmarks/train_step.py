"""One RL update step of `RLModule` (GRPO and PPO) on the embedded SmolLM2-135M-Instruct: seconds and
peak memory by group size and response length, under three fine-tuning modes: `full` (no LoRA),
`lora` (adapters on every decoder layer) and `lora-top` (adapters on the last `--top-layers` only,
`lora.top_layers`, as the CPU lift experiment trains: backward stops at the lowest adapted layer).

What is timed is the module's own step after the rollout: `_score_batch` (reference log-probs for
GRPO's KL, critic values for PPO), `_advantages` and `_update` (policy loss, KL, backward, optimiser
step; PPO also the critic's), i.e. the `time/update_s` the module logs itself. The rollout is NOT
included (generation has its own benchmark): each configuration gets a synthetic rollout batch of
exact shape, `states x G` rows of a P-token prompt and an L-token response (random token ids from the
tokenizer's vocabulary, no padding, random rewards in [0, 1)), which the module's `rollout` returns in
place of sampling. PPO samples once per state in training; here it gets the same `states x G` rows as
GRPO so that the two compare at equal tokens.

The module is the one `train.py` builds (`memr1.training.build_module` from `memr1/conf/train.yaml`,
`model=answer`, `trainer=cpu`: LoRA with the config's rank, a frozen reference copy for full GRPO,
a critic on its own backbone for PPO, adapted like the policy) and runs inside a real Lightning
`Trainer.fit` (CPU), one warm-up step then `--repeats` timed steps. `--old-logprobs rollout` (the
default, `engine=hf`) hands the step the sampler's log-probs as the HF engine does, computed before the
clock starts; `recompute` makes `_score_batch` recompute them, as it does after vLLM sampling.

Each configuration runs in its own subprocess, so memory does not carry over: "peak RSS" is the peak
resident memory during the steps (the high-water mark is reset once the models are loaded and their
weights paged in) and "step Δ RSS" that peak minus the resident memory after loading: activations,
gradients and AdamW state.
Ratios compare, at the same shape in the same run, PPO with GRPO (same mode) and full fine-tuning and
LoRA-top with LoRA on all layers (same algorithm): seconds per step and step Δ RSS.

    .venv/bin/python benchmarks/train_step.py --quick                  # grpo, G=2, P=64, L=16, lora + lora-top
    .venv/bin/python benchmarks/train_step.py --out train_step.json    # the full grid (24 configurations)
    .venv/bin/python benchmarks/train_step.py --algos grpo --lora lora lora-top --top-layers 10 --group-sizes 8
    .venv/bin/python benchmarks/train_step.py --precisions fp32 auto   # bf16 where the CPU has the units
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from machine import machine_info, print_machine  # noqa: E402  (benchmarks/machine.py, beside this script)

CONF = Path(__file__).resolve().parents[1] / "memr1" / "conf"
RESULT_PREFIX = "TRAIN_STEP_RESULT "  # marks the child's result line among Lightning's output
GIB = 1024**3
LORA_MODES = ("full", "lora", "lora-top")  # no LoRA; adapters on every layer; on the last --top-layers only
# "old": the update as it was before shared prompts (one forward per row, one torch thread per job as
# the docs advised, the entropy kept in the graph although its coefficient is 0, emulated by 1e-12, the
# frozen trunk run in every forward); "new": the defaults (a group's prompt forwarded once, every core,
# the entropy without a graph, the trunk's states given by the rollout with `--old-logprobs rollout`).
PATHS = {
    "old": ["algo.share_prompt=false", "algo.entropy_coef=1e-12", "algo.reuse_frozen_trunk=false"],
    "new": [],
}


@dataclass(frozen=True)
class StepConfig:
    algo: str
    lora: str  # one of LORA_MODES
    top_layers: int | None  # lora-top's lora.top_layers; None in the other modes
    group_size: int
    states: int
    prompt_length: int
    response_length: int
    micro_batch_size: int
    repeats: int
    old_logprobs: str  # "rollout": given by the sampler (engine=hf); "recompute": by _score_batch (vLLM)
    seed: int
    path: str = "new"  # one of PATHS
    precision: str = "auto"  # the `precision` key: auto (bf16 where the CPU has bf16 units) or fp32
    round: int = 0  # which pass over the grid (--rounds): ratios compare configurations of one round

    @property
    def rows(self) -> int:
        return self.states * self.group_size


# -- the child: one configuration, one process ----------------------------------------------------------
def current_rss() -> int:
    """Resident bytes now."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """Peak resident bytes (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Restart the high-water mark ru_maxrss reports (Linux >= 4.0), so loading peaks do not hide the step's."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def measure_one(config: StepConfig) -> dict[str, Any]:
    import torch
    from hydra import compose, initialize_config_dir
    from lightning.pytorch import Callback, Trainer, seed_everything
    from torch.utils.data import DataLoader

    from memr1.envs.base import Reward
    from memr1.factories import build_module
    from memr1.llm.trunk import frozen_trunk_depth
    from memr1.rl.batch import pack_rollouts, trunk_hidden_states
    from memr1.training import trainer_kwargs

    overrides = [
        "model=answer",
        f"algo={config.algo}",
        "trainer=cpu",
        "engine=hf",
        f"lora.enabled={str(config.lora != 'full').lower()}",
        f"lora.top_layers={config.top_layers if config.lora == 'lora-top' else 'null'}",
        f"algo.micro_batch_size={config.micro_batch_size}",
        f"seed={config.seed}",
        f"precision={config.precision}",
        *PATHS[config.path],
    ]
    torch.set_num_threads(1 if config.path == "old" else os.cpu_count() or 1)
    if config.algo == "grpo":
        overrides.append(f"algo.group_size={config.group_size}")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    seed_everything(config.seed, verbose=False)
    module = build_module(cfg)
    # from_pretrained leaves the safetensors weights memory-mapped: read each tensor once so the weights
    # count as loaded memory, not as the first step's.
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.sum()

    generator = torch.Generator().manual_seed(config.seed)
    vocab = module.tokenizer.vocab_size
    # One prompt per state, repeated for its G rows, as a rollout lays a group out.
    prompts = torch.randint(0, vocab, (config.states, config.prompt_length), generator=generator)
    batch = pack_rollouts(
        prompts.repeat_interleave(config.group_size, dim=0).tolist(),
        torch.randint(0, vocab, (config.rows, config.response_length), generator=generator).tolist(),
        torch.rand(config.rows, generator=generator).tolist(),
        module.tokenizer.pad_token_id,
    )
    rewards = [Reward.of(score) for score in batch.scores.tolist()]
    if config.old_logprobs == "rollout":
        # What the HF engine returns with its samples (equal to a forward pass within 1e-4). In bf16 the
        # module recomputes pi_old's log-probs itself (the sampler's round differently), as here.
        module.policy.eval()
        with torch.no_grad(), module.precision.autocast("cpu"):
            if module._reuse_sampler_logprobs:
                batch.old_logprobs = torch.cat([module._logprobs(module.policy, mb)[0] for mb in module._micro(batch)])
            depth = frozen_trunk_depth(module.policy) if module.algo.reuse_frozen_trunk else 0
            if depth:  # the HF engine records the frozen trunk's states as it samples
                batch.trunk_hidden = torch.cat(
                    [trunk_hidden_states(module.policy, mb, depth, module._sharing) for mb in module._micro(batch)]
                )
        module.policy.train()

    # The step fills the batch's fields in place: every step gets a fresh copy of the rollout tensors.
    module.rollout = lambda states: (dataclasses.replace(batch), rewards)
    stage_seconds: dict[str, float] = {}

    def timed(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            result = method(*args, **kwargs)
            stage_seconds[name] = time.perf_counter() - started
            return result

        return wrapper

    for stage in ("_score_batch", "_advantages", "_update"):
        setattr(module, stage, timed(stage.lstrip("_"), getattr(module, stage)))

    steps: list[dict[str, float]] = []

    class RecordStep(Callback):
        def on_train_batch_end(self, trainer: Trainer, pl_module: Any, *outputs_batch_and_index: Any) -> None:
            # The module's own clock: score + advantages + update, what it logs as time/update_s.
            steps.append({"step": pl_module.stage_seconds["update"], **stage_seconds})

    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    loaded_rss, load_peak = current_rss(), peak_rss()
    peak_was_reset = reset_peak_rss()
    step_count = 1 + config.repeats  # one warm-up step
    trainer = Trainer(
        **trainer_kwargs(cfg.trainer),
        max_steps=step_count,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[RecordStep()],
    )
    states = [f"state {index}" for index in range(config.states * step_count)]
    trainer.fit(module, train_dataloaders=DataLoader(states, batch_size=config.states, collate_fn=list))
    peak = peak_rss()

    timed_steps = steps[1:]
    seconds = statistics.median(step["step"] for step in timed_steps)
    return {
        **asdict(config),
        "rows": config.rows,
        "precision_chosen": module.precision.name,
        "lora_rank": cfg.lora.r if cfg.lora.enabled else None,
        "trainable_params": trainable,
        "torch_threads": torch.get_num_threads(),
        "seconds_per_step": seconds,
        "step_seconds": [step["step"] for step in timed_steps],  # the spread behind the median
        "stage_seconds": {
            stage: statistics.median(step[stage] for step in timed_steps)
            for stage in ("score_batch", "advantages", "update")
        },
        "warmup_seconds": steps[0]["step"],
        "tokens_per_s": config.rows * (config.prompt_length + config.response_length) / seconds,
        "loaded_rss_gib": loaded_rss / GIB,
        "load_peak_rss_gib": load_peak / GIB,
        # Without the reset the peak is the process's, loading included: the delta is then a lower bound.
        "peak_rss_gib": peak / GIB,
        "peak_was_reset": peak_was_reset,
        "step_rss_delta_gib": (peak - loaded_rss) / GIB,
    }


# -- the parent: the grid, one subprocess per configuration ---------------------------------------------
def run_in_subprocess(config: StepConfig) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--one", json.dumps(asdict(config))]
    finished = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in finished.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if finished.returncode != 0 or not lines:
        # Keep the grid going (one configuration may run out of memory); the error is reported.
        return {**asdict(config), "rows": config.rows, "error": (finished.stderr or finished.stdout)[-2000:]}
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def add_ratios(results: list[dict[str, Any]]) -> None:
    """PPO over GRPO (same mode, same shape); full and LoRA-top over LoRA on all layers (same algorithm, same
    shape): time, step Δ RSS."""

    def key(result: dict[str, Any], **changed: Any) -> tuple:
        names = ("algo", "lora", "group_size", "prompt_length", "response_length", "path", "precision", "round")
        defaults = {"path": "new", "precision": "auto", "round": 0}
        fields = {name: result.get(name, defaults.get(name)) for name in names}
        return tuple({**fields, **changed}.values())

    measured = {key(r): r for r in results if "error" not in r}
    for result in measured.values():
        for name, baseline_key in (
            ("ppo_over_grpo", key(result, algo="grpo") if result["algo"] == "ppo" else None),
            ("full_over_lora", key(result, lora="lora") if result["lora"] == "full" else None),
            ("lora_top_over_lora", key(result, lora="lora") if result["lora"] == "lora-top" else None),
            ("new_over_old", key(result, path="old") if result.get("path") == "new" else None),
            ("auto_over_fp32", key(result, precision="fp32") if result.get("precision") == "auto" else None),
        ):
            baseline = measured.get(baseline_key) if baseline_key else None
            if baseline is not None:
                result[name] = {
                    "seconds": result["seconds_per_step"] / baseline["seconds_per_step"],
                    "step_rss_delta": result["step_rss_delta_gib"] / baseline["step_rss_delta_gib"],
                }


def mode_label(mode: str, top_layers: int | None) -> str:
    return f"lora-top {top_layers}" if mode == "lora-top" else mode


def render(results: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    for column in ("algo", "mode", "path", "prec", "G", "rows", "P", "L", "s/step", "tokens/s", "peak RSS GiB", "step Δ RSS GiB",
                   "PPO/GRPO s, Δ", "full/LoRA s, Δ", "LoRA-top/LoRA s, Δ", "new/old s, Δ", "auto/fp32 s, Δ"):
        table.add_column(column, justify="right")

    def ratio(result: dict[str, Any], name: str, is_baseline: bool) -> str:
        if name in result:
            return f"{result[name]['seconds']:.2f}x, {result[name]['step_rss_delta']:.2f}x"
        return "base" if is_baseline else "—"

    for r in results:
        precision = r.get("precision", "auto") + (f" ({r['precision_chosen']})" if "precision_chosen" in r else "")
        shape = (r["algo"], mode_label(r["lora"], r["top_layers"]), r.get("path", "new"), precision, str(r["group_size"]),
                 str(r["rows"]), str(r["prompt_length"]), str(r["response_length"]))
        if "error" in r:
            table.add_row(*shape, "failed", "", "", "", "", "", "", "", "")
            continue
        table.add_row(
            *shape,
            f"{r['seconds_per_step']:.2f}",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['peak_rss_gib']:.2f}",
            f"{r['step_rss_delta_gib']:.2f}",
            ratio(r, "ppo_over_grpo", r["algo"] == "grpo"),
            ratio(r, "full_over_lora", r["lora"] == "lora"),
            ratio(r, "lora_top_over_lora", r["lora"] == "lora"),
            ratio(r, "new_over_old", r.get("path") == "old"),
            ratio(r, "auto_over_fp32", r.get("precision") == "fp32"),
        )
    return table


def ratios_over_rounds(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each ratio of a configuration over its baseline, one value per round: the median and the range."""
    ratio_names = ("ppo_over_grpo", "full_over_lora", "lora_top_over_lora", "new_over_old", "auto_over_fp32")
    config_names = [name for name in StepConfig.__dataclass_fields__ if name != "round"]
    per_config: dict[tuple, dict[str, list[float]]] = {}
    for result in results:
        config = tuple(result[name] for name in config_names)
        for name in ratio_names:
            if name in result:
                per_config.setdefault(config, {}).setdefault(name, []).append(result[name]["seconds"])
    summary = []
    for config, ratios in per_config.items():
        fields = dict(zip(config_names, config))
        for name, values in ratios.items():
            summary.append({"algo": fields["algo"], "lora": mode_label(fields["lora"], fields["top_layers"]),
                            "precision": fields["precision"], "ratio": name, "per_round": values,
                            "median": statistics.median(values), "min": min(values), "max": max(values)})
    return summary


def grid(args: argparse.Namespace) -> list[StepConfig]:
    return [
        StepConfig(algo, mode, args.top_layers if mode == "lora-top" else None, group_size, args.states,
                   args.prompt_length, length, args.micro_batch_size, args.repeats, args.old_logprobs, args.seed, path,
                   precision, round_index)
        for round_index in range(args.rounds)
        for mode in dict.fromkeys(args.lora)  # in the order given, repeats dropped
        for group_size in args.group_sizes
        for length in args.response_lengths
        for algo in args.algos
        for path in args.paths
        for precision in args.precisions
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", choices=("grpo", "ppo"), default=["grpo", "ppo"])
    parser.add_argument("--group-sizes", type=int, nargs="+", default=[4, 8], help="GRPO's G; rows = states x G")
    parser.add_argument("--response-lengths", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--prompt-length", type=int, default=400)
    parser.add_argument("--states", type=int, default=2, help="states per step")
    parser.add_argument("--lora", nargs="+", choices=LORA_MODES, default=list(LORA_MODES),
                        help="full: no LoRA; lora: adapters on every layer; lora-top: on the last --top-layers")
    parser.add_argument("--top-layers", type=int, default=10,
                        help="lora-top's lora.top_layers (SmolLM2-135M has 30 layers; the CPU lift uses 10)")
    parser.add_argument("--micro-batch-size", type=int, default=2, help="sequences per forward / backward")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per configuration (the median is shown)")
    parser.add_argument("--old-logprobs", choices=("rollout", "recompute"), default="rollout",
                        help="rollout: the sampler's (engine=hf); recompute: _score_batch recomputes them (vLLM)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--paths", nargs="+", choices=tuple(PATHS), default=["new"],
                        help="old: one forward per row, 1 thread, entropy graph; new: the defaults")
    parser.add_argument("--precisions", nargs="+", choices=("auto", "fp32", "bf16"), default=["auto"],
                        help="the precision key: auto is bf16 where the CPU has bf16 units (compare with fp32)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="passes over the grid; ratios are taken within a pass and summarised over passes")
    parser.add_argument("--quick", action="store_true", help="grpo, G=2, P=64, L=16, lora + lora-top only")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one StepConfig (JSON) in this process
    args = parser.parse_args()

    if args.one:
        print(RESULT_PREFIX + json.dumps(measure_one(StepConfig(**json.loads(args.one)))), flush=True)
        return
    if args.quick:
        args.algos, args.group_sizes, args.response_lengths = ["grpo"], [2], [16]
        args.prompt_length, args.lora = 64, ["lora", "lora-top"]
    if "grpo" in args.algos and min(args.group_sizes) < 2:
        parser.error("--group-sizes: GRPO needs at least 2 samples per state")
    if min(args.response_lengths + [args.prompt_length, args.states, args.micro_batch_size, args.repeats,
                                    args.top_layers, args.rounds]) < 1:
        parser.error("lengths, --states, --micro-batch-size, --repeats, --top-layers and --rounds must be >= 1")

    console = Console(width=160)
    print_machine()
    load_before = os.getloadavg()[0]  # timings on a shared machine move with its load: keep it beside them
    results = []
    for config in grid(args):
        console.log(f"round {config.round + 1}/{args.rounds}: {config.algo} {mode_label(config.lora, config.top_layers)} "
                    f"{config.precision} G={config.group_size} "
                    f"rows={config.rows} P={config.prompt_length} L={config.response_length} ...")
        result = run_in_subprocess(config)
        if "error" in result:
            console.log(f"[red]failed[/red]:\n{result['error']}")
        results.append(result)
    load_after = os.getloadavg()[0]
    add_ratios(results)

    title = (f"one RL step (score + advantages + update, no rollout): SmolLM2-135M, "
             f"micro-batch {args.micro_batch_size}, old log-probs: {args.old_logprobs}")
    console.print(render(results, title))
    summary = ratios_over_rounds(results)
    if args.rounds > 1:
        for row in summary:
            per_round = ", ".join(f"{value:.2f}" for value in row["per_round"])
            console.print(f"{row['ratio']} ({row['algo']}, {row['lora']}, {row['precision']}): median "
                          f"{row['median']:.2f}x over {len(row['per_round'])} rounds ({per_round})")
    console.print(f"{os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
                  f"1-min load average {load_before:.2f} at start, {load_after:.2f} at end")
    if args.out:
        machine = machine_info(load_before, load_after)
        report = {"machine": machine, "rollout_included": False, "results": results, "ratios_over_rounds": summary}
        args.out.write_text(json.dumps(report, indent=2))
        console.log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
