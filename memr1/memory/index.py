"""The in-process vector index that serves bank search (Milvus is the store of record).

Exact cosine search over unit vectors, partitioned by speaker so that a speaker-filtered search
touches only that speaker's rows. Results are ordered by score, then by creation step, then by id:
a total order, so a bank, its fork and a copy of it rank equal scores identically.

Scores are computed in float64 and rounded to float32. A dot product may be summed in a different
order depending on the matrix its row sits in (SIMD blocking, alignment); the float64 difference
(~1e-16) vanishes in the rounding, so one vector scores bit-identically in a bank's large matrix and
in a fork's small overlay.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import NamedTuple

import numpy as np


class Hit(NamedTuple):
    score: float
    step: int
    id: str


def hit_order(hit: Hit) -> tuple[float, int, str]:
    """Sort key: best score first, then the earlier-created memory, then the smaller id."""
    return (-hit.score, hit.step, hit.id)


def cosine_scores(vectors: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Cosine scores of unit vectors: vectors (n, dim) float64, queries (q, dim) float64 -> (q, n) float32.

    einsum, not BLAS: it runs on one thread. A threaded BLAS gemv this small spends its time waiting
    for its threads whenever the cores are busy (as they are during training). Measured p50 at 5k
    rows on 2 loaded cores: einsum 1.5 ms, threaded BLAS 7.7 ms.
    """
    return np.einsum("qd,nd->qn", queries, vectors).astype(np.float32)


def top_k(scores: np.ndarray, steps: np.ndarray, k: int) -> np.ndarray:
    """Row indices of the `k` best finite scores, best first, equal scores by smaller step.

    scores (n,) float32 (-inf marks an excluded row), steps (n,) int64 -> (m,) int64 with m <= k.
    Every row tied with the k-th score is a candidate, so ties at the cut are broken by step, not
    by wherever `np.partition` happened to put them.
    """
    n = scores.shape[0]
    if k <= 0 or n == 0:
        return np.empty(0, dtype=np.int64)
    if n > k:
        kth_best = np.partition(scores, n - k)[n - k]
        candidates = np.flatnonzero(scores >= kth_best)
    else:
        candidates = np.arange(n)
    candidates = candidates[scores[candidates] > -np.inf]
    order = np.lexsort((steps[candidates], -scores[candidates]))
    return candidates[order[:k]]


def merge_hits(groups: Iterable[list[Hit]], k: int) -> list[Hit]:
    """The `k` best hits of several best-first lists, in `hit_order`."""
    return sorted((hit for group in groups for hit in group), key=hit_order)[:k]


class _Partition:
    """One speaker's live vectors in a growable float64 matrix; removal moves the last row into the hole."""

    def __init__(self, dim: int) -> None:
        self.vectors = np.empty((64, dim), dtype=np.float64)
        self.steps = np.empty(64, dtype=np.int64)
        self.ids: list[str] = []
        self.row_of: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def put(self, memory_id: str, step: int, vector: np.ndarray) -> None:
        row = self.row_of.get(memory_id)
        if row is None:
            row = len(self.ids)
            if row == self.vectors.shape[0]:
                self._grow()
            self.ids.append(memory_id)
            self.row_of[memory_id] = row
        self.vectors[row] = vector
        self.steps[row] = step

    def remove(self, memory_id: str) -> None:
        row = self.row_of.pop(memory_id)
        last = len(self.ids) - 1
        if row != last:
            moved = self.ids[last]
            self.vectors[row] = self.vectors[last]
            self.steps[row] = self.steps[last]
            self.ids[row] = moved
            self.row_of[moved] = row
        self.ids.pop()

    def search(self, queries: np.ndarray, k: int, exclude: Collection[str]) -> list[list[Hit]]:
        n = len(self.ids)
        scores = cosine_scores(self.vectors[:n], queries)
        excluded_rows = [self.row_of[memory_id] for memory_id in exclude if memory_id in self.row_of]
        scores[:, excluded_rows] = -np.inf
        steps = self.steps[:n]
        return [
            [Hit(float(row_scores[row]), int(steps[row]), self.ids[row]) for row in top_k(row_scores, steps, k)]
            for row_scores in scores
        ]

    def _grow(self) -> None:
        capacity = 2 * self.vectors.shape[0]
        vectors = np.empty((capacity, self.vectors.shape[1]), dtype=np.float64)
        vectors[: len(self.ids)] = self.vectors[: len(self.ids)]
        steps = np.empty(capacity, dtype=np.int64)
        steps[: len(self.ids)] = self.steps[: len(self.ids)]
        self.vectors, self.steps = vectors, steps


class VectorIndex:
    """Live memories' vectors by speaker: exact top-k search, O(1) insert, replace and remove."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._partitions: dict[str, _Partition] = {}
        self._speaker_of: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._speaker_of)

    def __contains__(self, memory_id: object) -> bool:
        return memory_id in self._speaker_of

    def put(self, memory_id: str, speaker: str, step: int, vector: np.ndarray) -> None:
        """Insert a memory, or replace the vector and step of one already indexed. vector (dim,)."""
        if self._speaker_of.get(memory_id, speaker) != speaker:
            self.remove(memory_id)
        partition = self._partitions.get(speaker)
        if partition is None:
            partition = self._partitions[speaker] = _Partition(self.dim)
        partition.put(memory_id, step, vector)
        self._speaker_of[memory_id] = speaker

    def remove(self, memory_id: str) -> None:
        speaker = self._speaker_of.pop(memory_id)
        partition = self._partitions[speaker]
        partition.remove(memory_id)
        if not partition:
            del self._partitions[speaker]

    def search(
        self, queries: np.ndarray, speaker: str | None, k: int, exclude: Collection[str] = ()
    ) -> list[list[Hit]]:
        """Best `k` hits per query among `speaker`'s memories (all speakers if None), skipping `exclude`.

        queries (q, dim) float64 unit rows -> q lists of at most k hits, in `hit_order`.
        """
        if speaker is not None:
            partition = self._partitions.get(speaker)
            return partition.search(queries, k, exclude) if partition else [[] for _ in queries]
        per_partition = [partition.search(queries, k, exclude) for partition in self._partitions.values()]
        return [merge_hits((hits[query] for hits in per_partition), k) for query in range(len(queries))]


_UNIT_NORM_TOLERANCE = 1e-3


def unit_rows(vectors: np.ndarray, dim: int, where: str) -> np.ndarray:
    """`vectors` as float32 (n, dim), checked finite and L2-normalised (the index scores cosine as a dot)."""
    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim != 2 or array.shape[1] != dim:
        raise ValueError(f"{where}: expected shape (n, {dim}), got {array.shape}")
    norms = np.linalg.norm(array, axis=1)
    bad = np.flatnonzero(~np.isfinite(norms) | (np.abs(norms - 1.0) > _UNIT_NORM_TOLERANCE))
    if bad.size:
        raise ValueError(f"{where}: row {bad[0]} has norm {norms[bad[0]]:.4g}; vectors must be finite and unit-length")
    return array
