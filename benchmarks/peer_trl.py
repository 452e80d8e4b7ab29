"""memr1's GRPO step beside TRL's `GRPOTrainer` on the same work: seconds and CPU seconds per step, and
the training-reward curves (`make bench-peer`).

The same work on both sides:
- prompts: the first `--states * --steps` Answer Agent states of LoCoMo's training conversation (conv-26),
  no-distill agent, `--k` memories per speaker (~300-token chat prompts), dumped once by this script in
  memr1's venv to `<out dir>/peer_prompts.json` and read by both sides in the same order (TRL's dataset
  shuffle is off): step s trains on prompts [s*B, (s+1)*B);
- model: the embedded SmolLM2-135M-Instruct (the converted checkpoint directory, one path for both);
- LoRA rank / alpha / target modules on the top `--top-layers` decoder layers (peft's layers_to_transform),
  dropout 0; G samples per prompt at temperature 1, `--response-length` new tokens at most; AdamW at
  `--lr`, one optimiser step per rollout batch, KL coefficient `--beta` (the paper's 0.001) to the
  adapter-free reference, clip 0.2, group-normalised advantages, token-mean loss (TRL's "dapo");
- reward: token F1 of the parsed answer against the gold answer, the same Python function
  (`memr1.metrics.lexical.token_f1` after `AnswerAgent(distill=False).parse`) imported on both sides;
- decoding stops on the same EOS ids on both sides (memr1's: the tokenizer's and the generation
  config's, dumped with the prompts); fp32 on both sides (memr1's `precision=fp32`, TRL's `bf16=False`);
- TRL's activation (gradient) checkpointing off, as memr1 has none: with PEFT it would recompute every
  layer's forward in the backward, work memr1 does not do. The effective value is recorded.

So the comparison is "same maths, less compute": what differs is how each side computes the step
(memr1 forwards a group's prompt once, runs the frozen trunk below the LoRA layers once per token, and
sends only real response tokens through the LM head). Generated and prompt tokens per step are recorded
on both sides, so a side that happened to write shorter responses is seen (seconds per generated token).

TRL runs in its own venv (`make bench-peer` builds it under $MEMR1_CACHE/venvs/trl: trl, peft, CPU torch
2.13.0 and the two pure-Python packages the reward imports), so the project's dependencies stay as they
are. Runs are interleaved A B B A (memr1, TRL, TRL, memr1), one process each, under the same load; a
step is timed from its start to its end (generation, reward, reference, update) by wall clock and by the
process's CPU time (all threads), the first step of each run is warm-up and dropped, the ratio is of the
medians over the remaining steps of both runs of a side (10 a run by default, 20 a side), with their
quartiles.

    .venv/bin/python benchmarks/peer_trl.py --trl-python $MEMR1_CACHE/venvs/trl/bin/python --out runs/bench/peer_trl.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the TRL venv imports the shared reward from this checkout
RESULT_PREFIX = "PEER_RESULT "


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def f1_reward(completion: str, gold: str) -> float:
    """The reward of both sides: token F1 of the no-distill agent's parsed answer (what
    `memr1.envs.rewards.answer_reward(..., "f1")` computes; imported from the metric itself, as
    `memr1.envs` needs Milvus, which the TRL venv does not have)."""
    from memr1.agents.answer import AnswerAgent
    from memr1.metrics.lexical import token_f1

    return token_f1(AnswerAgent(distill=False).parse(completion).answer, gold)


# -- the prompts (memr1's venv) ------------------------------------------------------------------------
def dump_prompts(path: Path, count: int, k: int) -> None:
    from hydra import compose, initialize_config_dir

    from memr1.apps import CONFIG_DIR
    from memr1.data_modules.rl_states import RLStatesDataModule
    from memr1.envs.answer import AnswerEnv
    from memr1.agents.answer import AnswerAgent
    from transformers import GenerationConfig

    from memr1.llm.engines import default_eos_token_ids, encode_prompts
    from memr1.llm.loading import load_tokenizer, resolve_checkpoint

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        # Banks of its own (ADD-all, built in seconds): a training run may hold the default ones.
        cfg = compose("train", ["model=answer", "answer.distill=false", f"answer.k_per_speaker={k}", f"banks.dir={path.parent / 'banks'}"])
    data = RLStatesDataModule.from_config(cfg)
    data.setup()
    env = AnswerEnv(AnswerAgent(distill=False))
    states = [data.train_states[index] for index in range(count)]
    tokenizer = load_tokenizer(cfg.backbone.name_or_path)
    checkpoint = resolve_checkpoint(cfg.backbone.name_or_path)
    eos_ids = default_eos_token_ids(tokenizer, SimpleNamespace(generation_config=GenerationConfig.from_pretrained(checkpoint)))
    prompts = [env.prompt(state) for state in states]
    lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts)]
    rows = [{"prompt": prompt, "gold": state.question.answer, "prompt_tokens": n} for prompt, state, n in zip(prompts, states, lengths)]
    data.teardown()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"model": checkpoint, "eos_token_ids": sorted(eos_ids), "rows": rows}))


# -- memr1's side ----------------------------------------------------------------------------------------
def run_memr1(args: argparse.Namespace, dumped: dict[str, Any]) -> dict[str, Any]:
    import torch
    from hydra import compose, initialize_config_dir
    from lightning.pytorch import Callback, Trainer, seed_everything
    from torch.utils.data import DataLoader

    from memr1.apps import CONFIG_DIR
    from memr1.envs.base import Reward
    from memr1.modules.outputs import StepOutput
    from memr1.factories import build_module
    from memr1.training import trainer_kwargs

    torch.set_num_threads(os.cpu_count() or 1)
    overrides = [
        "model=answer", "answer.distill=false", "algo=grpo", "trainer=cpu", "lora.enabled=true",
        f"lora.r={args.rank}", f"lora.alpha={args.alpha}", f"lora.top_layers={args.top_layers}",
        f"algo.group_size={args.group_size}", f"answer.max_new_tokens={args.response_length}",
        f"algo.actor_lr={args.lr}", f"algo.kl_coef={args.beta}", "algo.temperature=1.0",
        f"algo.micro_batch_size={args.group_size * args.states}", f"seed={args.seed}", "precision=fp32",
    ]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides)
    seed_everything(args.seed, verbose=False)
    module = build_module(cfg)
    rows = dumped["rows"][: args.states * args.steps]

    def rows_of(step: int) -> list[dict[str, Any]]:
        return rows[step * args.states : (step + 1) * args.states]

    class DumpedPrompts:
        """The dumped rows as states: their prompt as given, their reward the shared F1; `agent` is the
        module's (the no-distill Answer Agent), which its step metrics read."""

        def __init__(self, agent: Any) -> None:
            self.agent = agent

        def prompt(self, row: dict[str, Any]) -> list[dict[str, str]]:
            return row["prompt"]

        def score(self, rows: list[dict[str, Any]], responses: list[str]) -> list[Reward]:
            return [Reward.of(f1_reward(text, row["gold"])) for row, text in zip(rows, responses)]

    module.env = DumpedPrompts(module.env.agent)
    module.engine.eos_token_ids = frozenset(dumped["eos_token_ids"])
    steps: list[dict[str, float]] = []

    class Clock(Callback):
        def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.started, self.cpu = time.perf_counter(), cpu_seconds()

        def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, *rest: Any) -> None:
            step = StepOutput.of(outputs)
            metrics, batch = step.metrics, step.rollout
            steps.append({
                "seconds": time.perf_counter() - self.started, "cpu_seconds": cpu_seconds() - self.cpu,
                "reward": metrics["reward/mean"],
                "generated_tokens": float(batch.response_mask.sum()),
                "prompt_tokens": float(sum(row["prompt_tokens"] for row in rows_of(trainer.global_step - 1)) * args.group_size),
                # where memr1's step went: rollout, reward, update (the reference's scoring included)
                **{key.removeprefix("time/"): value for key, value in metrics.items()
                   if key.startswith("time/") and key.endswith("_s")},
            })

    trainer = Trainer(
        **trainer_kwargs(cfg.trainer), max_steps=args.steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
        callbacks=[Clock()],
    )
    trainer.fit(module, train_dataloaders=DataLoader(rows, batch_size=args.states, collate_fn=list, shuffle=False))
    return {"side": "memr1", "steps": steps, "torch_threads": torch.get_num_threads()}


# -- TRL's side (its own venv) ---------------------------------------------------------------------------
def run_trl(args: argparse.Namespace, dumped: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(os.cpu_count() or 1)
    rows = dumped["rows"][: args.states * args.steps]
    dataset = Dataset.from_list([{"prompt": row["prompt"], "gold": row["gold"]} for row in rows])
    tokenizer = AutoTokenizer.from_pretrained(dumped["model"])
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(dumped["model"], dtype=torch.float32)
    layers = model.config.num_hidden_layers
    lora = LoraConfig(
        r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        layers_to_transform=list(range(layers - args.top_layers, layers)), task_type="CAUSAL_LM",
    )

    def reward(prompts: list[Any], completions: list[Any], gold: list[str], **kwargs: Any) -> list[float]:
        return [f1_reward(c[0]["content"] if isinstance(c, list) else c, g) for c, g in zip(completions, gold)]

    config = GRPOConfig(
        output_dir=str(Path(args.out).parent / "trl_out"), per_device_train_batch_size=args.states * args.group_size,
        num_generations=args.group_size, max_completion_length=args.response_length, temperature=1.0, top_p=1.0,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.01, max_grad_norm=1.0,
        beta=args.beta, epsilon=0.2, loss_type="dapo", scale_rewards="group", num_iterations=1,
        max_steps=args.steps, shuffle_dataset=False, logging_steps=1, report_to=[], save_strategy="no",
        use_cpu=True, bf16=False, seed=args.seed, remove_unused_columns=False, disable_tqdm=True,
        gradient_checkpointing=False, generation_kwargs={"eos_token_id": dumped["eos_token_ids"]},
    )
    steps: list[dict[str, float]] = []
    logged: list[dict[str, float]] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *unused: Any, **kwargs: Any) -> None:
            self.started, self.cpu = time.perf_counter(), cpu_seconds()

        def on_step_end(self, *unused: Any, **kwargs: Any) -> None:
            steps.append({"seconds": time.perf_counter() - self.started, "cpu_seconds": cpu_seconds() - self.cpu})

        def on_log(self, *unused: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
            if logs and "reward" in logs:
                logged.append(dict(logs))

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tokenizer,
                          peft_config=lora, callbacks=[Clock()])
    checkpointing = {"args.gradient_checkpointing": trainer.args.gradient_checkpointing,
                     "model.is_gradient_checkpointing": bool(getattr(trainer.model, "is_gradient_checkpointing", False))}
    trainer.train()
    completions = args.states * args.group_size
    previous_tokens = 0.0
    for step, logs in zip(steps, logged):
        step["reward"] = float(logs["reward"])
        step["generated_tokens"] = float(logs["completions/mean_length"]) * completions
        # num_tokens counts prompt and completion tokens seen so far
        step["prompt_tokens"] = float(logs["num_tokens"]) - previous_tokens - step["generated_tokens"]
        previous_tokens = float(logs["num_tokens"])
    return {"side": "trl", "steps": steps, "torch_threads": torch.get_num_threads(), "activation_checkpointing": checkpointing,
            "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}}


# -- the parent ------------------------------------------------------------------------------------------
def child(python: str, side: str, args: argparse.Namespace, prompts: Path) -> dict[str, Any]:
    command = [python, str(Path(__file__).resolve()), "--side", side, "--prompts", str(prompts), *sys.argv[1:]]
    finished = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in finished.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if finished.returncode != 0 or not lines:
        raise RuntimeError(f"the {side} run failed:\n{(finished.stderr or finished.stdout)[-3000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def summarise(runs: list[dict[str, Any]], side: str) -> dict[str, Any]:
    timed = [step for run in runs if run["side"] == side for step in run["steps"][1:]]

    def quartiles(key: str) -> list[float]:
        return statistics.quantiles([step[key] for step in timed], n=4)

    seconds_q = quartiles("seconds")
    return {
        "seconds_per_step": statistics.median(step["seconds"] for step in timed),
        "seconds_per_step_quartiles": [seconds_q[0], seconds_q[2]],
        "cpu_seconds_per_step": statistics.median(step["cpu_seconds"] for step in timed),
        "generated_tokens_per_step": statistics.median(step["generated_tokens"] for step in timed),
        "prompt_tokens_per_step": statistics.median(step["prompt_tokens"] for step in timed),
        "seconds_per_generated_token": statistics.median(step["seconds"] / max(step["generated_tokens"], 1.0) for step in timed),
        "timed_steps": len(timed),
    }


def plot_rewards(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    for number, run in enumerate(runs):
        style = "-" if run["side"] == "memr1" else "--"
        axis.plot(range(1, len(run["steps"]) + 1), [s.get("reward", float("nan")) for s in run["steps"]], style, marker="o",
                  label=f"{run['side']} (run {number + 1})")
    axis.set_xlabel("step (the same prompts on both sides)")
    axis.set_ylabel("mean training reward (F1)")
    axis.set_title("GRPO training reward: memr1 vs TRL GRPOTrainer", fontsize=10)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trl-python", default=str(Path(os.environ.get("MEMR1_CACHE", Path.home() / ".cache/memr1")) / "venvs/trl/bin/python"))
    parser.add_argument("--states", type=int, default=4, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=4, help="G")
    parser.add_argument("--steps", type=int, default=11, help="steps per run (the first is warm-up)")
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--k", type=int, default=3, help="memories per speaker in the prompts")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=int, default=32)
    parser.add_argument("--top-layers", type=int, default=10)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--beta", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench/peer_trl.json")
    parser.add_argument("--side", choices=("memr1", "trl"), help=argparse.SUPPRESS)
    parser.add_argument("--prompts", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.side:
        dumped = json.loads(Path(args.prompts).read_text())
        result = run_memr1(args, dumped) if args.side == "memr1" else run_trl(args, dumped)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return

    from machine import machine_info, print_machine  # benchmarks/machine.py, beside this script

    print_machine()
    out = Path(args.out)
    prompts = out.parent / "peer_prompts.json"
    dump_prompts(prompts, args.states * args.steps, args.k)
    load_before = os.getloadavg()[0]
    runs = []
    for side in ("memr1", "trl", "trl", "memr1"):  # A B B A: drift in the load falls on both sides alike
        python = sys.executable if side == "memr1" else args.trl_python
        runs.append(child(python, side, args, prompts))
        print(f"{side}: {[round(step['seconds'], 1) for step in runs[-1]['steps']]} s per step", flush=True)
    memr1, trl_side = summarise(runs, "memr1"), summarise(runs, "trl")
    lengths = [row["prompt_tokens"] for row in json.loads(prompts.read_text())["rows"]]
    result = {
        "settings": {key: value for key, value in vars(args).items() if key not in ("side", "prompts", "trl_python")},
        "prompt_tokens_mean": statistics.mean(lengths),
        "memr1": memr1,
        "trl": trl_side,
        "ratio_memr1_over_trl": {
            "seconds": memr1["seconds_per_step"] / trl_side["seconds_per_step"],
            "cpu_seconds": memr1["cpu_seconds_per_step"] / trl_side["cpu_seconds_per_step"],
            "seconds_per_generated_token": memr1["seconds_per_generated_token"] / trl_side["seconds_per_generated_token"],
        },
        "runs": runs,
        "machine": machine_info(load_before, os.getloadavg()[0]),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot_rewards(runs, out.with_suffix(".png"))
    ratio = result["ratio_memr1_over_trl"]
    print(f"memr1 {memr1['seconds_per_step']:.1f} s/step ({memr1['cpu_seconds_per_step']:.1f} CPU s), "
          f"TRL {trl_side['seconds_per_step']:.1f} s/step ({trl_side['cpu_seconds_per_step']:.1f} CPU s): "
          f"memr1/TRL {ratio['seconds']:.2f}x wall, {ratio['cpu_seconds']:.2f}x CPU, "
          f"{ratio['seconds_per_generated_token']:.2f}x per generated token "
          f"({memr1['generated_tokens_per_step']:.0f} vs {trl_side['generated_tokens_per_step']:.0f} tokens a step); "
          f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
