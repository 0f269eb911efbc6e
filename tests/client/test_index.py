"""VectorIndex: in-memory cosine search with swap-remove and growth."""

import numpy as np
import pytest
from meancache.client.cache.index import VectorIndex

# Compares the results of numeric kernels: CI runs these on AVX2 kernels too.
pytestmark = pytest.mark.kernels


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """n random unit vectors."""
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_empty_index_finds_nothing() -> None:
    index = VectorIndex(4)
    assert len(index) == 0
    assert index.search(np.ones(4, dtype=np.float32)) == ([], None)


def test_add_and_search_returns_best_first() -> None:
    index = VectorIndex(3)
    index.add("x", np.array([1, 0, 0], dtype=np.float32))
    index.add("y", np.array([0, 1, 0], dtype=np.float32))
    index.add("xy", np.array([0.6, 0.8, 0], dtype=np.float32))
    query = np.array([0.8, 0.6, 0], dtype=np.float32)
    result = index.search(query, k=3)[0]
    assert [i for i, _ in result] == ["xy", "x", "y"]
    assert [s for _, s in result] == pytest.approx([0.96, 0.8, 0.6])
    assert "xy" in index and "z" not in index
    assert len(index) == 3


def test_k_limits_the_result() -> None:
    rng = np.random.default_rng(1)
    vectors = unit(rng, 50, 8)
    index = VectorIndex(8)
    index.add_many([f"e{i}" for i in range(50)], vectors)
    query = vectors[7]
    scores = vectors @ query
    result = index.search(query, k=5)[0]
    assert [i for i, _ in result] == [f"e{i}" for i in np.argsort(-scores)[:5]]
    assert result[0] == ("e7", pytest.approx(1.0))


def test_min_score_filters() -> None:
    index = VectorIndex(2)
    index.add("a", np.array([1, 0], dtype=np.float32))
    index.add("b", np.array([0.6, 0.8], dtype=np.float32))
    index.add("c", np.array([-1, 0], dtype=np.float32))
    result, best = index.search(np.array([1, 0], dtype=np.float32), k=10, min_score=0.5)
    assert [i for i, _ in result] == ["a", "b"]
    assert best == pytest.approx(1.0)
    assert index.search(np.array([0, -1], dtype=np.float32), min_score=0.5) == (
        [], pytest.approx(0.0))  # nothing above, but the best cosine is still reported


def test_adding_an_existing_id_replaces_its_vector() -> None:
    index = VectorIndex(2)
    index.add("a", np.array([1, 0], dtype=np.float32))
    index.add("a", np.array([0, 1], dtype=np.float32))
    assert len(index) == 1
    assert index.search(np.array([0, 1], dtype=np.float32))[0] == [("a", pytest.approx(1.0))]


def test_wrong_dimension_is_rejected() -> None:
    index = VectorIndex(3)
    with pytest.raises(ValueError, match="3-d"):
        index.add("a", np.ones(4, dtype=np.float32))


def test_remove_swaps_the_last_row_into_the_hole() -> None:
    rng = np.random.default_rng(2)
    vectors = unit(rng, 4, 6)
    index = VectorIndex(6)
    index.add_many(["a", "b", "c", "d"], vectors)
    index.remove("b")
    assert index.ids == ["a", "d", "c"]
    np.testing.assert_array_equal(index.vectors(), vectors[[0, 3, 2]])
    # d now lives in b's old row and is still found under its own id
    assert index.search(vectors[3], k=1)[0] == [("d", pytest.approx(1.0))]
    assert "b" not in index
    index.remove("b")  # removing twice is harmless
    index.remove("d")
    assert index.ids == ["a", "c"]
    index.add("e", vectors[1])
    assert index.search(vectors[1], k=1)[0][0][0] == "e"


def test_growth_past_initial_capacity() -> None:
    rng = np.random.default_rng(3)
    vectors = unit(rng, 40, 5)
    index = VectorIndex(5, capacity=2)
    index.add_many([f"e{i}" for i in range(40)], vectors)
    assert len(index) == 40
    for i in (0, 1, 2, 39):
        assert index.search(vectors[i], k=1)[0][0][0] == f"e{i}"
    np.testing.assert_array_equal(index.vectors(), vectors)


def test_random_operations_match_a_brute_force_reference() -> None:
    rng = np.random.default_rng(4)
    index = VectorIndex(8, capacity=4)
    reference: dict[str, np.ndarray] = {}
    for step in range(300):
        if reference and rng.random() < 0.35:
            victim = list(reference)[rng.integers(len(reference))]
            index.remove(victim)
            del reference[victim]
        else:
            key = f"e{rng.integers(60)}"  # some ids come back: add replaces
            reference[key] = unit(rng, 1, 8)[0]
            index.add(key, reference[key])
        assert len(index) == len(reference)
        if step % 25 == 0 and reference:
            query = unit(rng, 1, 8)[0]
            got = index.search(query, k=len(reference))[0]
            want = sorted(((k, float(v @ query)) for k, v in reference.items()),
                          key=lambda kv: -kv[1])
            # Best first, every id, every score its reference's: a dot product of 8 float32
            # terms summed in another order is off by <= 8 x eps (1e-6 for unit vectors), so
            # only ids whose scores tie within that could swap places on another CPU.
            scores = [s for _, s in got]
            assert scores == sorted(scores, reverse=True)
            assert {k for k, _ in got} == {k for k, _ in want}
            reference_score = dict(want)
            assert all(abs(s - reference_score[k]) <= 8 * np.finfo(np.float32).eps
                       for k, s in got)
    assert sorted(index.ids) == sorted(reference)
    for key, vector in zip(index.ids, index.vectors(), strict=True):
        np.testing.assert_allclose(vector, reference[key])
