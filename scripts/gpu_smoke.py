"""The Python half of scripts/gpu_smoke.sh (read that first): what it packs and what it runs.

    pack SMOKE_DIR          a tiny random policy backbone (SmolLM2's tokenizer), a tiny random sentence
                            embedder (MiniLM's tokenizer) and LoCoMo's train and validation conversations
    run SMOKE_DIR [--cpu]   train.py on one device with trainer=fsdp (GRPO, then PPO) and trainer=gpu
                            (GRPO), two steps each over banks kept in memory; each export reloaded in
                            plain transformers + peft; evaluate.py on the first export; one verdict line
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = 2
# The no-distill Answer Agent with 4 new tokens over banks kept in memory, in training and evaluation.
AGENT = ("banks.uri=:memory:", "answer.distill=false", "answer.k_per_speaker=2", "answer.max_new_tokens=4")
# A tiny run: two states a step, LoRA (the default), an entropy bonus so that the weights move although
# a random model earns no reward.
RUN = (
    "algo.actor_lr=1e-3", "algo.micro_batch_size=2", "algo.entropy_coef=0.1",
    "data_loader.states_per_step=2", f"data_loader.max_steps={STEPS}", f"data_loader.val_check_interval={STEPS}",
    "data_loader.limit_val_batches=1", "data_loader.val_batch_size=2", "logging.wandb=false",
    "logging.plots=false",  # matplotlib and its binary wheels would tie the pack to one Python version
)
# evaluate.py always draws scores.png: it uses the image's matplotlib (3.11 on the H200 image).
EVALUATED_QUESTIONS = 8
GRPO, PPO = ("algo.group_size=2",), ("algo=ppo", "algo.critic_lr=1e-3")
FSDP = ("trainer=fsdp", "trainer.devices=1")
# name: (trainer on a GPU, the same on CPU for the rehearsal, the algorithm's settings). trainer=gpu is
# Lightning's single-device strategy; its rehearsal is trainer=cpu.
RUNS = {
    "fsdp-grpo": (FSDP, (*FSDP, "trainer.accelerator=cpu"), GRPO),
    "fsdp-ppo": (FSDP, (*FSDP, "trainer.accelerator=cpu"), PPO),
    "gpu-grpo": (("trainer=gpu",), ("trainer=cpu",), GRPO),
}


def pack(smoke: Path) -> None:
    from memr1.datasets.locomo_file import default_locomo_path
    from memr1.llm.loading import load_tokenizer
    from memr1.llm.testing import save_tiny_checkpoint, save_tiny_embedder

    save_tiny_checkpoint(smoke / "tiny-lm", load_tokenizer("embedded:smollm2-135m-instruct"))
    save_tiny_embedder(smoke / "tiny-embedder")
    kept = {"conv-26", "conv-30"}  # conf/data/locomo.yaml's train and validation splits
    conversations = [c for c in json.loads(default_locomo_path().read_text()) if c["sample_id"] in kept]
    (smoke / "locomo.json").write_text(json.dumps(conversations))


def launch(smoke: Path, work: Path, script: str, name: str, args: tuple[str, ...]) -> tuple[int, float]:
    """`script` (train.py or evaluate.py) on the packed model, embedder and data, logged to NAME.log:
    its exit status and seconds."""
    command = [
        sys.executable, str(ROOT / script), f"backbone.name_or_path={smoke / 'tiny-lm'}",
        f"banks.embedder={smoke / 'tiny-embedder'}", f"banks.dir={work / 'banks'}", f"data.path={smoke / 'locomo.json'}",
        "data.sha256=null", *AGENT, *args,
    ]
    started = time.monotonic()
    with (work / f"{name}.log").open("w") as log:
        status = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    return status, time.monotonic() - started


def export_moved(backbone: Path, export: Path) -> float:
    """Reload `export` as a user would (transformers, and peft for an adapter; no memr1) and return the
    largest change of the next-token logits against the backbone on one prompt: 0 means the training
    moved nothing."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()  # one "Loading weights" bar per model would bury the verdict
    tokenizer = AutoTokenizer.from_pretrained(export)
    inputs = tokenizer("Where did Caroline move from?", return_tensors="pt")
    with torch.no_grad():
        before = AutoModelForCausalLM.from_pretrained(backbone)(**inputs).logits[0, -1]
        if (export / "adapter_config.json").exists():
            from peft import AutoPeftModelForCausalLM

            trained = AutoPeftModelForCausalLM.from_pretrained(str(export))
        else:  # LoRA merged at export, or full fine-tuning
            trained = AutoModelForCausalLM.from_pretrained(export)
        after = trained(**inputs).logits[0, -1]
    return float((after - before).abs().max())


def run(smoke: Path, cpu: bool) -> int:
    import torch

    device = "CPU (rehearsal)" if cpu else torch.cuda.get_device_name(0)
    work = Path(os.environ.get("GPU_SMOKE_WORK", smoke / "work"))
    shutil.rmtree(work, ignore_errors=True)  # every run starts over: a run directory left behind would resume
    work.mkdir(parents=True)
    def failed(name: str, status: int, seconds: float) -> int:
        print((work / f"{name}.log").read_text()[-4000:])
        print(f"GPU SMOKE FAIL on {device}: {name} exited {status} after {seconds:.0f} s (log: {work / name}.log)")
        return 1

    results = []
    for name, (on_gpu, on_cpu, algo) in RUNS.items():
        run_dir = work / name
        status, seconds = launch(smoke, work, "train.py", name, (f"run_dir={run_dir}", *(on_cpu if cpu else on_gpu), *RUN, *algo))
        if status != 0:
            return failed(name, status, seconds)
        moved = export_moved(smoke / "tiny-lm", run_dir / "policy" / "last")
        if moved == 0.0:
            print(f"GPU SMOKE FAIL on {device}: {name}'s export reloads but equals the backbone: training moved nothing")
            return 1
        results.append(f"{name} {STEPS} steps {seconds:.0f} s (export reloads, logits moved {moved:.2g})")
    scored = work / "evaluate"
    status, seconds = launch(smoke, work, "evaluate.py", "evaluate", (
        f"ckpt={work / next(iter(RUNS)) / 'policy' / 'last'}", f"max_questions={EVALUATED_QUESTIONS}", f"hydra.run.dir={scored}",
    ))
    if status != 0:
        return failed("evaluate", status, seconds)
    count = json.loads((scored / "report.json").read_text())["scores"]["count"]
    if count != EVALUATED_QUESTIONS:
        print(f"GPU SMOKE FAIL on {device}: evaluate.py scored {count:.0f} questions, not {EVALUATED_QUESTIONS}")
        return 1
    results.append(f"evaluate.py {EVALUATED_QUESTIONS} questions {seconds:.0f} s")
    print(f"GPU SMOKE PASS on {device}, one device: " + "; ".join(results))
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("pack", "run"))
    parser.add_argument("smoke", type=Path, help="the directory pack fills and run reads (.gpu_smoke)")
    parser.add_argument("--cpu", action="store_true", help="run on CPU processes (trainer.accelerator=cpu)")
    args = parser.parse_args()
    if args.action == "pack":
        pack(args.smoke)
    else:
        sys.exit(run(args.smoke, args.cpu))


if __name__ == "__main__":
    main()
