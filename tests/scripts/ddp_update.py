"""One update step of tests/fixed_update.py on 1 or 2 CPU processes (Lightning DDP, gloo); rank 0 saves
the (all-reduced) gradients it stepped with. With 2 processes rank r takes group r's rows.

    python ddp_update.py grpo|sft DEVICES OUT.pt
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixed_update import GROUP, build, step  # noqa: E402
from memr1.llm.loading import load_tokenizer  # noqa: E402


def main() -> None:
    algo_name, devices, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    torch.set_num_threads(1)
    rank = int(os.environ.get("LOCAL_RANK", "0"))  # set by Lightning in the process it launches
    states = range(2 * GROUP) if devices == 1 else range(rank * GROUP, (rank + 1) * GROUP)
    module = build(load_tokenizer("embedded:smollm2-135m-instruct"), algo_name, micro=2)
    options = {"devices": devices, "strategy": "ddp_find_unused_parameters_true"} if devices > 1 else {}
    grads = step(module, states, **options)
    if rank == 0:
        torch.save(grads, out)


if __name__ == "__main__":
    main()
