"""The embedder: real all-MiniLM-L6-v2, offline. About 3 s on 2 CPU cores after the shared model load."""

from __future__ import annotations

import numpy as np
import pytest

from memr1.embed import Embedder


def test_shape_dtype_and_unit_norm(embedder: Embedder) -> None:
    vectors = embedder.encode(["Andrew adopted a dog named Buddy", "Audrey went hiking"])
    assert vectors.shape == (2, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), [1.0, 1.0], atol=1e-5)


def test_similar_sentences_score_higher(embedder: Embedder) -> None:
    anchor, paraphrase, unrelated = embedder.encode(
        ["Andrew adopted a dog named Buddy", "Andrew has a new puppy called Buddy", "The bond market fell on Tuesday"]
    )
    assert anchor @ paraphrase > anchor @ unrelated + 0.3


def test_batches_and_duplicates_match_one_at_a_time(embedder: Embedder) -> None:
    texts = [f"memory number {i} about trip {i % 7}" for i in range(70)]  # 70 > 64: two batches
    together = embedder.encode(texts + texts[:3])
    uncached = Embedder(embedder.model_name, cache_size=0)
    alone = np.stack([uncached.encode([text])[0] for text in texts[:3]])
    assert together.shape == (73, 384)
    np.testing.assert_array_equal(together[70:], together[:3])  # duplicates: the same vector
    np.testing.assert_allclose(together[:3], alone, atol=1e-5)  # batch padding changes nothing that matters


def test_cache_hit_returns_the_same_vector_and_is_not_aliased(embedder: Embedder) -> None:
    first = embedder.encode(["Caroline paints sunsets"])
    assert embedder.is_cached("Caroline paints sunsets")
    first[0, :] = 0.0  # the caller owns its copy: the cache must not change
    second = embedder.encode(["Caroline paints sunsets"])
    assert np.linalg.norm(second[0]) == pytest.approx(1.0, abs=1e-5)


def test_lru_eviction_order(embedder: Embedder) -> None:
    small = Embedder(embedder.model_name, cache_size=2)
    small.encode(["a", "b", "c"])  # "a" is the least recently used of three: evicted
    assert [small.is_cached(text) for text in "abc"] == [False, True, True]
    small.encode(["b"])  # a hit makes "b" the most recent
    small.encode(["d"])  # so "c" goes
    assert [small.is_cached(text) for text in "abcd"] == [False, True, False, True]


def test_empty_input(embedder: Embedder) -> None:
    assert embedder.encode([]).shape == (0, 384)


def test_bad_input_is_named(embedder: Embedder) -> None:
    with pytest.raises(TypeError, match="one str"):
        embedder.encode("a single string")
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        embedder.encode(["fine", 3])
    with pytest.raises(ValueError, match="cache_size"):
        Embedder(cache_size=-1)
