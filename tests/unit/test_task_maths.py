"""The maths of each capability (numerics/pooling.py, tasks/scores.py) against hand-computed
values: no model, no torch, plain numpy arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infinity_cloud.core.family import DenseLayer
from infinity_cloud.numerics.heads import Head
from infinity_cloud.numerics.pooling import (
    apply_dense,
    l2_normalize,
    pool,
    supported_activation,
    truncate_dimensions,
)
from infinity_cloud.tasks.scores import label_scores, rank, sigmoid, softmax

# Two rows, right-padded: row 1 has two real tokens and a padded position holding values
# (50, 0) that would win a max and shift a mean if the mask were ignored. Row 1's real
# values are all negative, so a padded 0 leaking into max pooling would show too.
HIDDEN = np.array(
    [
        [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]],
        [[-3.0, -1.0], [-2.0, -5.0], [50.0, 0.0]],
    ],
    dtype=np.float32,
)
MASK = np.array([[1, 1, 1], [1, 1, 0]], dtype=np.int64)

POOLED = {
    "mean": [[3.0, 4.0], [-2.5, -3.0]],
    "cls": [[1.0, 2.0], [-3.0, -1.0]],
    "max": [[5.0, 6.0], [-2.0, -1.0]],
    "lasttoken": [[5.0, 6.0], [-2.0, -5.0]],
    "mean_sqrt_len": [[9.0 / math.sqrt(3), 12.0 / math.sqrt(3)], [-5.0 / math.sqrt(2), -6.0 / math.sqrt(2)]],
}


# -- pooling -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", sorted(POOLED))
def test_pool_right_padded(mode: str) -> None:
    out = pool(HIDDEN, MASK, mode)
    assert out.dtype == np.float32 and out.shape == (2, 2)
    np.testing.assert_allclose(out, POOLED[mode], rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_pool_returns_float32(dtype: type) -> None:
    out = pool(HIDDEN.astype(dtype), MASK, "mean")
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, POOLED["mean"], rtol=1e-3)


def test_pool_single_token_rows() -> None:
    hidden = np.array([[[7.0, -7.0], [1.0, 1.0]]], dtype=np.float32)
    mask = np.array([[1, 0]])
    for mode in POOLED:
        np.testing.assert_allclose(pool(hidden, mask, mode), [[7.0, -7.0]], err_msg=mode)


def test_lasttoken_left_padding() -> None:
    hidden = np.arange(2 * 4 * 2, dtype=np.float32).reshape(2, 4, 2)
    # Row 0: left-padded, last real token at position 3. Row 1: padded on both sides
    # (last real token at 2) - the last *real* token wins, wherever padding sits.
    mask = np.array([[0, 0, 1, 1], [0, 1, 1, 0]])
    np.testing.assert_array_equal(pool(hidden, mask, "lasttoken"), [hidden[0, 3], hidden[1, 2]])


def test_mean_left_padding() -> None:
    hidden = np.array([[[100.0], [2.0], [4.0]]], dtype=np.float32)
    np.testing.assert_allclose(pool(hidden, np.array([[0, 1, 1]]), "mean"), [[3.0]])


def test_pool_unknown_mode() -> None:
    with pytest.raises(ValueError, match="weightedmean"):
        pool(HIDDEN, MASK, "weightedmean")


# -- dense heads ---------------------------------------------------------------------

W = np.array([[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]], dtype=np.float32)
B = np.array([0.25, -1.0], dtype=np.float32)
X = np.array([[1.0, 2.0, 3.0], [-1.0, 0.0, 4.0]], dtype=np.float32)
LINEAR = [[1.0 - 3.0 + 0.25, 0.5 + 4.0 - 1.0], [-1.0 - 4.0 + 0.25, -0.5 + 0.0 - 1.0]]


@pytest.mark.parametrize(
    ("activation", "fn"),
    [
        ("Identity", lambda v: v),
        ("Tanh", math.tanh),
        ("ReLU", lambda v: max(v, 0.0)),
        ("Sigmoid", lambda v: 1.0 / (1.0 + math.exp(-v))),
        ("SiLU", lambda v: v / (1.0 + math.exp(-v))),
    ],
)
def test_apply_dense_activations(activation: str, fn) -> None:
    assert supported_activation(activation)
    out = apply_dense(X, [DenseLayer(W, B, activation)])
    expected = [[fn(v) for v in row] for row in LINEAR]
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)


def test_apply_dense_chain_without_bias() -> None:
    second = DenseLayer(np.array([[1.0, 1.0]], dtype=np.float32), None, "Identity")
    out = apply_dense(X, [DenseLayer(W, B, "Identity"), second])
    np.testing.assert_allclose(out, [[sum(LINEAR[0])], [sum(LINEAR[1])]], rtol=1e-6)


def test_apply_dense_no_layers_is_identity() -> None:
    np.testing.assert_array_equal(apply_dense(X, []), X)


def test_unsupported_activation() -> None:
    assert not supported_activation("GELU")


def test_embedding_head_pools_then_dense_then_normalizes() -> None:
    layer = DenseLayer(np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32), None, "Identity")
    out = Head("pool", "mean", (layer,), normalize=True)(HIDDEN, MASK)
    np.testing.assert_allclose(out, l2_normalize(np.array([[3.0, 8.0], [-2.5, -6.0]])), rtol=1e-6)
    raw = Head("pool", "mean", (layer,), normalize=False)(HIDDEN, MASK)
    np.testing.assert_allclose(raw, [[3.0, 8.0], [-2.5, -6.0]], rtol=1e-6)


# -- normalisation and Matryoshka ----------------------------------------------------


def test_l2_normalize() -> None:
    out = l2_normalize(np.array([[3.0, 4.0], [0.0, -2.0], [0.0, 0.0]]))
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, -1.0], [0.0, 0.0]])  # zero stays zero, no NaN


def test_l2_normalize_single_vector() -> None:
    np.testing.assert_allclose(l2_normalize(np.array([0.0, 5.0, 12.0])), [0.0, 5 / 13, 12 / 13])


VECTORS = np.array([[3.0, 4.0, 12.0], [0.0, -1.0, 1.0]], dtype=np.float32)


@pytest.mark.parametrize(
    ("renormalize", "expected"),
    [(True, [[0.6, 0.8], [0.0, -1.0]]), (False, [[3.0, 4.0], [0.0, -1.0]])],
)
def test_truncate_dimensions(renormalize: bool, expected: list[list[float]]) -> None:
    out = truncate_dimensions(VECTORS, 2, renormalize=renormalize)
    assert out.shape == (2, 2) and out.flags.c_contiguous
    np.testing.assert_allclose(out, expected, rtol=1e-6)


@pytest.mark.parametrize("dimensions", [None, 0, 3, 4])
@pytest.mark.parametrize("renormalize", [True, False])
def test_truncate_dimensions_noop(dimensions: int | None, renormalize: bool) -> None:
    np.testing.assert_array_equal(truncate_dimensions(VECTORS, dimensions, renormalize), VECTORS)


# -- scores --------------------------------------------------------------------------


def test_sigmoid_values() -> None:
    x = np.array([-2.0, 0.0, 2.0])
    np.testing.assert_allclose(sigmoid(x), [1 / (1 + math.e**2), 0.5, 1 / (1 + math.e**-2)], rtol=1e-12)


def test_sigmoid_stable_at_extremes() -> None:
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        out = sigmoid(np.array([-1000.0, -50.0, 50.0, 1000.0], dtype=np.float32))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, [0.0, math.exp(-50) / (1 + math.exp(-50)), 1 / (1 + math.exp(-50)), 1.0])
    assert out[0] >= 0.0 and out[-1] <= 1.0


def test_sigmoid_keeps_shape() -> None:
    assert sigmoid(np.zeros((2, 3))).shape == (2, 3)


def test_softmax_values() -> None:
    out = softmax(np.array([[0.0, math.log(2.0)], [1.0, 1.0]]))
    np.testing.assert_allclose(out, [[1 / 3, 2 / 3], [0.5, 0.5]], rtol=1e-12)


def test_softmax_stable_at_extremes() -> None:
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        out = softmax(np.array([[1000.0, 1000.0, -1000.0], [-1000.0, -1000.0, -1000.0]]))
    np.testing.assert_allclose(out, [[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]], atol=1e-12)


def test_softmax_axis() -> None:
    x = np.array([[0.0, 5.0], [0.0, -5.0]])
    out = softmax(x, axis=0)
    np.testing.assert_allclose(out.sum(axis=0), [1.0, 1.0])
    np.testing.assert_allclose(out[:, 0], [0.5, 0.5])


@pytest.mark.parametrize(
    ("top_n", "expected"),
    [(None, [1, 4, 0, 2, 3]), (0, [1, 4, 0, 2, 3]), (2, [1, 4]), (3, [1, 4, 0]), (10, [1, 4, 0, 2, 3])],
)
def test_rank_stable_with_ties(top_n: int | None, expected: list[int]) -> None:
    scores = [0.5, 0.9, 0.5, 0.1, 0.9]
    assert rank(scores, top_n) == expected
    assert rank(np.array(scores, dtype=np.float32), top_n) == expected


def test_rank_all_equal_keeps_input_order() -> None:
    assert rank(np.zeros(6), None) == list(range(6))


def test_rank_negative_scores() -> None:
    assert rank([-3.0, -1.0, -2.0], None) == [1, 2, 0]


def test_label_scores_highest_first() -> None:
    out = label_scores(np.array([0.1, 0.7, 0.2]), ["a", "b", "c"])
    assert [label for label, _ in out] == ["b", "c", "a"]
    assert [score for _, score in out] == pytest.approx([0.7, 0.2, 0.1])
    assert all(isinstance(score, float) for _, score in out)


def test_label_scores_ties_keep_label_order() -> None:
    out = label_scores(np.array([0.25, 0.5, 0.25]), ["x", "y", "z"])
    assert [label for label, _ in out] == ["y", "x", "z"]


# -- tasks: a capability is a task the engine runs ------------------------------------------


def test_every_capability_has_its_task() -> None:
    from infinity_cloud.core.capability import Capability
    from infinity_cloud.tasks.registry import TASKS

    assert set(TASKS) == set(Capability)
    assert all(task.capability is capability for capability, task in TASKS.items())



def test_agreement_is_the_worst_row_not_the_best() -> None:
    """One row pointing elsewhere is enough to fail a precision, however good the others are."""
    from infinity_cloud.numerics.fidelity import agreement

    rng = np.random.default_rng(0)
    reference = rng.standard_normal((8, 16)).astype(np.float32)
    candidate = reference + 1e-4 * rng.standard_normal((8, 16)).astype(np.float32)
    assert agreement(candidate, reference) > 0.9999
    candidate[5] = -candidate[5]
    assert agreement(candidate, reference) < -0.99


def test_agreement_of_scores_is_their_ranking() -> None:
    """A reranker's scores agree when they rank alike; reversed, they do not."""
    from infinity_cloud.numerics.fidelity import agreement

    scores = np.array([[2.0], [0.5], [-1.0], [3.0]], dtype=np.float32)
    assert agreement(scores + 0.001, scores) > 0.999
    assert agreement(-scores, scores) < -0.99


def test_agreement_of_token_vectors_counts_real_tokens_only() -> None:
    from infinity_cloud.numerics.fidelity import agreement

    rng = np.random.default_rng(1)
    reference = rng.standard_normal((2, 5, 4)).astype(np.float32)
    reference[1, 3:] = 0  # padding
    candidate = reference.copy()
    assert agreement(candidate, reference) > 0.9999
    candidate[0, 2] = -candidate[0, 2]
    assert agreement(candidate, reference) < -0.99
