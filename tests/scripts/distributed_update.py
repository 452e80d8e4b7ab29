"""Update steps of tests/fixed_update.py on 1 or 2 CPU processes (gloo): Lightning DDP, or FSDP2
through `ModelParallelStrategy` as `trainer=fsdp trainer.accelerator=cpu` builds it. Rank 0 saves the
gradients the last step stepped with (all-reduced; gathered when sharded) and the trainable
parameters after the last step (gathered). With 2 processes rank r takes group r's rows.

    python distributed_update.py grpo|ppo|sft DEVICES ddp|fsdp STEPS OUT.pt [full]

`full`: the whole model trained instead of LoRA adapters (SFT).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixed_update import GROUP, build, step, trainable_parameters  # noqa: E402
from memr1.llm.loading import load_tokenizer  # noqa: E402
from memr1.training import trainer_kwargs  # noqa: E402


def main() -> None:
    algo_name, devices, kind, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), Path(sys.argv[5])
    lora = sys.argv[6:] != ["full"]
    torch.set_num_threads(1)
    rank = int(os.environ.get("LOCAL_RANK", "0"))  # set by Lightning in the process it launches
    states = range(2 * GROUP) if devices == 1 else range(rank * GROUP, (rank + 1) * GROUP)
    module = build(load_tokenizer("embedded:smollm2-135m-instruct"), algo_name, micro=2, lora=lora)
    options = {}
    if devices > 1:  # the strategy train.py builds for trainer=cpu / trainer=fsdp trainer.accelerator=cpu
        trainer = {"kind": "cpu" if kind == "ddp" else "fsdp", "accelerator": "cpu", "devices": devices, "num_nodes": 1, "precision": None}
        options = {"devices": devices, "strategy": trainer_kwargs(OmegaConf.create(trainer))["strategy"]}
    grads = step(module, states, steps=steps, **options)
    params = trainable_parameters(module)  # every rank gathers (a collective)
    if rank == 0:
        torch.save({"grads": grads, "params": params, "sharded": module._sharded}, out)


if __name__ == "__main__":
    main()
