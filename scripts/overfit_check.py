"""Does the RL core learn? GRPO on 4 fixed training states until their sampled reward at least doubles.

The module, environment and data are train.py's (`memr1.factories.build_module`, the RL state data
module of memr1/conf/train.yaml), on the embedded SmolLM2-135M-Instruct: the no-distill Answer Agent with an
F1 reward, G = 8, LoRA on the top 10 layers, actor LR 2e-3, 3 memories per speaker, 32 new tokens.
The same 4 states (the data module's probe set) make every step's batch, so a rising reward means the
policy fits them. Prints the machine (CPU, speed flags, load) and the precision it trains in (`precision=auto`
unless overridden: bf16 where the CPU has bf16 units), the sampled reward per step and the greedy reward
before and after, and exits 1 when the last 3 steps' mean sampled reward is not at least twice the first step's.

    .venv/bin/python scripts/overfit_check.py [--steps 15] [--out runs/overfit_check.json]
    .venv/bin/python scripts/overfit_check.py algo.ppo_epochs=2 algo.mini_batch_size=16   # other settings
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

OVERRIDES = [
    "model=answer", "answer.distill=false", "model.reward=f1", "answer.k_per_speaker=3",
    "algo=grpo", "algo.group_size=8", "algo.actor_lr=2e-3", "algo.kl_coef=0.0", "answer.max_new_tokens=32",
    "algo.temperature=1.0", "lora.enabled=true", "lora.top_layers=10", "data_loader.states_per_step=4",
    "trainer=cpu", "logging.wandb=false",
]


def greedy_reward(module, states) -> float:
    from memr1.llm.sampling import SamplingConfig

    outputs = module.engine.generate([module.env.prompt(s) for s in states], SamplingConfig(max_new_tokens=module.max_new_tokens, temperature=0.0))
    rewards = module.env.score(states, [samples[0].text for samples in outputs])
    return sum(r.score for r in rewards) / len(rewards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--out", type=Path)
    parser.add_argument("overrides", nargs="*", help="train.py overrides on top of the check's own")
    args = parser.parse_args()

    from hydra import compose, initialize_config_dir
    from lightning.pytorch import Callback, Trainer, seed_everything
    from torch.utils.data import DataLoader

    from memr1.apps import CONFIG_DIR
    from memr1.data_modules.rl_states import RLStatesDataModule
    from machine import machine_info, print_machine  # benchmarks/machine.py: the line every benchmark prints
    from memr1.quiet import quiet_third_party
    from memr1.factories import build_module
    from memr1.modules.outputs import StepOutput

    quiet_third_party()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[*OVERRIDES, *args.overrides])
    seed_everything(cfg.seed, verbose=False)
    data = RLStatesDataModule.from_config(cfg)
    data.setup("fit")
    states = data.probe_states(4)
    module = build_module(cfg)
    print_machine()
    print(f"precision: {module.precision.name}", flush=True)
    load_before = os.getloadavg()[0]
    before = greedy_reward(module, states)
    print(f"greedy reward before: {before:.3f}", flush=True)

    rows: list[dict] = []
    started = time.perf_counter()

    class Report(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, *rest) -> None:
            metrics = StepOutput.of(outputs).metrics
            rows.append({key: metrics[key] for key in ("reward/mean", "response/length_mean", "reward/zero_std_group_frac", "time/rollout_s", "time/update_s")}
                        | {key: value for key, value in metrics.items() if key.startswith(("actor/clip_frac", "actor/approx_kl"))})
            print(f"step {trainer.global_step:2d} | sampled reward {metrics['reward/mean']:.3f} | zero-spread {metrics['reward/zero_std_group_frac']:.2f} "
                  f"| length {metrics['response/length_mean']:.1f} | rollout {metrics['time/rollout_s']:.0f}s update {metrics['time/update_s']:.0f}s", flush=True)

    trainer = Trainer(accelerator="cpu", max_steps=args.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[Report()])
    trainer.fit(module, train_dataloaders=DataLoader([states] * args.steps, batch_size=None, collate_fn=lambda batch: batch))
    after = greedy_reward(module, states)
    first, last = rows[0]["reward/mean"], statistics.mean(row["reward/mean"] for row in rows[-3:])
    doubled = last >= 2 * first
    print(f"greedy reward after: {after:.3f}")
    print(f"sampled reward: step 1 {first:.3f} -> last 3 steps {last:.3f} ({last / first if first else float('inf'):.2f}x): "
          + ("doubled" if doubled else "did NOT double"))
    print(f"wall time {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"overrides": [*OVERRIDES, *args.overrides], "precision": module.precision.name,
                  "machine": machine_info(load_before, os.getloadavg()[0]), "wall_s": time.perf_counter() - started,
                  "greedy_before": before, "greedy_after": after, "steps": rows, "doubled": doubled}
        args.out.write_text(json.dumps(report, indent=2))
    data.teardown("fit")
    sys.exit(0 if doubled else 1)


if __name__ == "__main__":
    main()
