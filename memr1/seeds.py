"""The random streams a run derives from its one `seed`, in one place.

A run samples rollouts (per step, and per dynamic-sampling draw), probes, validation samples and the
order of its mini-batches, each from a torch generator seeded here. The seed of each stream is a hash
of (seed, purpose, indices): two purposes, or two steps, never share a stream, however long the run
(arithmetic like `seed * a + step + b * draw` gives a later step the seed of an earlier draw), and a
resumed run derives exactly the seeds the unbroken run did. numpy draws (the training order, the probe
set, dynamic sampling's extra states) seed `np.random.default_rng` with such tuples directly: its
SeedSequence already keeps them apart.
"""

from __future__ import annotations

import hashlib

STREAMS = ("rollout", "probe", "validation_sample", "minibatch_order")


def stream_seed(seed: int, purpose: str, *indices: int) -> int:
    """The seed of stream `purpose` (one of `STREAMS`) at `indices` (e.g. step, draw), in [0, 2**63)."""
    if purpose not in STREAMS:
        raise ValueError(f"stream_seed: unknown purpose {purpose!r}; expected one of {STREAMS}")
    key = repr((int(seed), purpose, tuple(int(index) for index in indices))).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
