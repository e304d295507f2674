"""Sampler: purity in (seed, step), O(1) seek, and the statistics each mode promises."""

from __future__ import annotations

import hashlib
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chute import Sampler, WeightedSampler

MODES = ["sequential", "iid", "cyclic"]


def _chi2_p(counts: np.ndarray) -> float:
    """Upper-tail p-value of Pearson's chi-square against a uniform expectation."""
    from math import erfc, sqrt

    expected = counts.sum() / counts.size
    stat = float(((counts - expected) ** 2 / expected).sum())
    dof = counts.size - 1
    # Wilson-Hilferty normal approximation of the chi-square tail; exact enough for dof >= 9.
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / sqrt(2 / (9 * dof))
    return 0.5 * erfc(z / sqrt(2))


@pytest.mark.parametrize("mode", MODES)
def test_batch_is_pure_function_of_seed_and_step(mode: str) -> None:
    a = Sampler(1000, 32, mode, seed=7)
    b = Sampler(1000, 32, mode, seed=7)
    stream = [next(a) for _ in range(50)]
    b.seek(25)
    assert b.step == 25
    for s in range(25, 50):
        np.testing.assert_array_equal(next(b), stream[s])
    for s in (49, 3, 17):
        np.testing.assert_array_equal(a.indices(s), stream[s])
    assert all(x.dtype == np.uint64 and x.shape == (32,) for x in stream)


@pytest.mark.parametrize("mode", ["iid", "cyclic"])
def test_seed_changes_the_stream(mode: str) -> None:
    a = Sampler(1 << 20, 64, mode, seed=1).indices(5)
    b = Sampler(1 << 20, 64, mode, seed=2).indices(5)
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("mode", MODES)
def test_slices_compose_the_batch(mode: str) -> None:
    s = Sampler(997, 100, mode, seed=3)
    whole = s.indices(12)
    parts = [s.indices(12, i, i + 25) for i in range(0, 100, 25)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    with pytest.raises(ValueError, match="outside a batch"):
        s.indices(12, 50, 101)


def test_sequential_is_a_circular_window() -> None:
    s = Sampler(10, 4, "sequential")
    got = [s.indices(i).tolist() for i in range(4)]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [2, 3, 4, 5]]
    big = Sampler(2**64 - 1, 3, "sequential")
    start = (10**18 * 3) % (2**64 - 1)
    assert big.indices(10**18).tolist() == [start, start + 1, start + 2]
    assert Sampler(3, 7, "sequential").indices(0).tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_iid_is_uniform() -> None:
    n = 37
    s = Sampler(n, 4096, "iid", seed=11)
    draws = np.concatenate([s.indices(i) for i in range(100)])
    assert draws.max() < n
    assert _chi2_p(np.bincount(draws.astype(np.int64), minlength=n)) > 1e-4


def test_iid_is_unbiased_where_modulo_would_not_be() -> None:
    # With length = 3 * 2**62, taking a 64-bit draw modulo length would land in [0, 2**62)
    # twice as often as elsewhere; Lemire's rejection keeps the four quarters even.
    n = 3 << 62
    draws = np.concatenate([Sampler(n, 8192, "iid", seed=5).indices(i) for i in range(8)])
    quarter = (draws >> np.uint64(62)).astype(np.int64)
    counts = np.bincount(quarter, minlength=3)
    assert counts.size == 3
    assert _chi2_p(counts) > 1e-4


def test_iid_positions_are_independent() -> None:
    # Adjacent positions and adjacent steps must not correlate (counter-based streams).
    s = Sampler(16, 2048, "iid", seed=1)
    a = np.concatenate([s.indices(i) for i in range(64)]).astype(np.int64)
    pairs = a[:-1] * 16 + a[1:]
    assert _chi2_p(np.bincount(pairs, minlength=256)) > 1e-4


@pytest.mark.parametrize("length", [1, 2, 10, 17, 256, 1000, 4099])
def test_cyclic_cycles_are_permutations(length: int) -> None:
    batch = max(1, length // 4)
    s = Sampler(length, batch, "cyclic", seed=length)
    per = s.steps_per_cycle
    assert per == length // batch
    for cycle in range(3):
        seen = np.concatenate([s.indices(cycle * per + k) for k in range(per)])
        assert len(seen) == per * batch
        assert len(np.unique(seen)) == len(seen)  # no repeats within a cycle
        assert seen.max() < length
        if per * batch == length:
            np.testing.assert_array_equal(np.sort(seen), np.arange(length))


def test_cyclic_remainder_changes_between_cycles() -> None:
    s = Sampler(103, 10, "cyclic", seed=0)  # 10 steps per cycle, 3 dropped each cycle
    dropped = []
    for cycle in range(6):
        seen = np.concatenate([s.indices(cycle * 10 + k) for k in range(10)])
        dropped.append(frozenset(set(range(103)) - set(seen.tolist())))
    assert all(len(d) == 3 for d in dropped)
    assert len(set(dropped)) > 1


def test_cyclic_permutations_are_uniform() -> None:
    # Where does item 0 land in each cycle's permutation: uniform over positions, and every
    # cycle differs from the last.
    n, cycles = 12, 6000
    s = Sampler(n, n, "cyclic", seed=9)
    perms = np.stack([s.indices(c) for c in range(cycles)]).astype(np.int64)
    position_of_0 = np.argmax(perms == 0, axis=1)
    assert _chi2_p(np.bincount(position_of_0, minlength=n)) > 1e-4
    first = np.bincount(perms[:, 0], minlength=n)
    assert _chi2_p(first) > 1e-4
    assert len({p.tobytes() for p in perms}) > cycles * 0.99


def test_cyclic_large_space_has_no_repeats() -> None:
    s = Sampler(2**64 - 1, 4096, "cyclic", seed=2**64 - 1)
    batch = np.concatenate([s.indices(2**40 + k) for k in range(4)])
    assert len(np.unique(batch)) == batch.size


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"length must be in \[1, 2\*\*64\), got 0"):
        Sampler(0, 4)
    with pytest.raises(ValueError, match=r"batch_size must be in \[1, 2\*\*64\), got 0"):
        Sampler(10, 0)
    with pytest.raises(ValueError, match="mode must be one of"):
        Sampler(10, 2, "shuffle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without replacement"):
        Sampler(3, 4, "cyclic")
    with pytest.raises(ValueError, match="seed"):
        Sampler(10, 2, seed=-1)
    with pytest.raises(ValueError, match="length"):
        Sampler(2**64, 2)
    with pytest.raises(TypeError, match="length must be an int"):
        Sampler(10.0, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="step"):
        Sampler(10, 2).seek(-1)
    with pytest.raises(ValueError, match="step"):
        Sampler(10, 2).indices(-1)
    with pytest.raises(TypeError, match="step must be an int"):
        Sampler(10, 2).indices(1.5)  # type: ignore[arg-type]


def test_numpy_integers_are_accepted() -> None:
    s = Sampler(np.int64(50), np.int32(5), "iid", seed=np.uint64(3))
    np.testing.assert_array_equal(s.indices(np.int64(4)), s.indices(4))


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(1, 2**64 - 1),
    batch=st.integers(1, 64),
    seed=st.integers(0, 2**64 - 1),
    step=st.integers(0, 2**64 - 1),
    mode=st.sampled_from(MODES),
)
def test_any_step_is_in_range_and_repeatable(
    length: int, batch: int, seed: int, step: int, mode: str
) -> None:
    if mode == "cyclic":
        batch = min(batch, length)
    s = Sampler(length, batch, mode, seed=seed)  # type: ignore[arg-type]
    out = s.indices(step)
    assert out.shape == (batch,)
    assert int(out.max()) < length
    np.testing.assert_array_equal(out, s.indices(step))
    if mode == "cyclic":
        assert len(np.unique(out)) == batch


def test_weighted_frequencies_follow_the_weights() -> None:
    weights = np.array([1.0, 2.0, 0.0, 4.0, 8.0, 0.5, 0.0, 16.5])
    s = WeightedSampler(weights, batch_size=1000, seed=11)
    draws = np.concatenate([s.indices(step) for step in range(200)])
    assert set(np.unique(draws).tolist()) == {0, 1, 3, 4, 5, 7}  # zero weights never drawn
    counts = np.bincount(draws.astype(np.int64), minlength=len(weights)).astype(float)
    p = weights / weights.sum()
    live = p > 0
    expected = p[live] * draws.size
    stat = float(((counts[live] - expected) ** 2 / expected).sum())
    # chi-square with 5 degrees of freedom: P(stat > 20.5) < 0.001
    assert stat < 20.5, (counts, expected)
    np.testing.assert_allclose(s.probabilities, p)


def test_weighted_class_balance_evens_out_classes() -> None:
    labels = np.array([0] * 900 + [1] * 90 + [2] * 10)
    weights = 1.0 / np.bincount(labels)[labels]
    s = WeightedSampler(weights, batch_size=3000, seed=2)
    seen = np.bincount(labels[s.indices(0).astype(np.int64)], minlength=3)
    assert all(abs(c - 1000) < 150 for c in seen), seen  # ~6 sigma for p=1/3, n=3000


def test_weighted_is_pure_in_step_and_seeks_in_constant_work() -> None:
    w = np.random.default_rng(0).random(5000)
    a, b = WeightedSampler(w, 64, seed=5), WeightedSampler(w, 64, seed=5)
    far = 10**18
    direct = a.indices(far)
    for _ in range(30):  # history does not matter: nothing is replayed
        next(b)
    b.seek(far)
    np.testing.assert_array_equal(next(b), direct)
    assert b.step == far + 1
    np.testing.assert_array_equal(
        np.concatenate([a.indices(far, 0, 20), a.indices(far, 20, 64)]), direct
    )
    assert not np.array_equal(WeightedSampler(w, 64, seed=6).indices(far), direct)
    assert int(direct.max()) < 5000 and direct.dtype == np.uint64


def test_weighted_fingerprint_tracks_the_weights() -> None:
    w = np.arange(1, 11, dtype=float)
    assert WeightedSampler(w, 4).fingerprint() == WeightedSampler(w.copy(), 4, seed=3).fingerprint()
    assert WeightedSampler(w, 4).fingerprint() != WeightedSampler(w[::-1], 4).fingerprint()


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([], "non-empty 1-D"),
        ([[1.0, 2.0]], "non-empty 1-D"),
        (["a", "b"], "non-empty 1-D"),
        ([True, False], "non-empty 1-D"),
        ([1.0, -1.0], "non-negative"),
        ([1.0, np.nan], "finite"),
        ([1.0, np.inf], "finite"),
        ([0.0, 0.0], "sum to 0"),
    ],
)
def test_bad_weights_are_clear_errors(weights: list[object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WeightedSampler(weights, 4)  # type: ignore[arg-type]


TINY = float(np.nextafter(0.0, 1.0))  # the smallest subnormal, 5e-324


@pytest.mark.parametrize(
    "weights",
    [
        np.full(100, 1e308),  # the sum overflows
        np.full(100, np.exp(709)),
        np.full(100, TINY),  # the sum underflows: total / 2**53 is 0
        np.r_[np.full(50, 1e308), np.full(50, 0.5e308)],  # 2:1 between two halves
        np.r_[np.full(50, TINY), np.full(50, 2 * TINY)],
        np.r_[np.full(50, 3e38), np.full(50, 1.5e38)].astype(np.float32),
    ],
)
def test_weighted_extreme_weights_draw_in_proportion(weights: np.ndarray) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning on the way
        s = WeightedSampler(weights, batch_size=20_000, seed=4)
        draws = np.concatenate([s.indices(step) for step in range(5)])
    p = weights.astype(np.float64) / weights.max()
    p /= p.sum()
    np.testing.assert_allclose(s.probabilities, p, rtol=1e-12)
    counts = np.bincount(draws.astype(np.int64), minlength=weights.size)
    expected = p * draws.size  # 1000 or more per index
    # seeded, so the counts are fixed; 6 sigma would still hold for any seed
    assert np.all(np.abs(counts - expected) < 6 * np.sqrt(expected)), counts
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < 200, stat  # chi-square, 99 degrees of freedom: P(> 200) < 1e-8


def test_weighted_draws_and_fingerprints_are_those_of_earlier_versions() -> None:
    """Scaling the weights by a power of two changes no draw: saved states still resume."""
    cases = {
        "lin": (np.linspace(0, 1, 1000), [826, 856, 473, 908, 322, 381, 706, 500],
                "41b672c285b76f2f", "d3adb57840bab8c7"),
        "f32": (np.random.default_rng(3).random(777).astype(np.float32),
                [524, 562, 171, 641, 75, 109, 372, 189], "bb4263039ca2724b", "4e40e9b2b5cf6242"),
        "int": (np.array([0, 3, 0, 1, 7, 0, 2, 0]), [4, 4, 1, 4, 1, 1, 4, 3],
                "a53b8072619bfbd9", "a97c9e5c52e7df08"),
    }  # fmt: skip
    for weights, first, digest, stream in cases.values():
        s = WeightedSampler(weights, 16, seed=9)
        assert s.indices(0)[:8].tolist() == first
        assert s.fingerprint() == {"kind": "weighted", "length": weights.size, "weights": digest}
        draws = np.concatenate([s.indices(step) for step in range(2000)])
        assert hashlib.sha256(draws.tobytes()).hexdigest()[:16] == stream


def test_weighted_construction_holds_one_array_of_the_weights_length() -> None:
    n = 2_000_000
    weights = np.random.default_rng(0).random(n, dtype=np.float32)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        s = WeightedSampler(weights, 4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the float64 cumulative weights it keeps, plus chunk-sized temporaries
    assert peak < 8 * n + (8 << 20), peak
    assert s.indices(0).max() < n


def test_batch_size_and_length_say_the_range_they_take() -> None:
    for bad in (-1, -3, 0):
        with pytest.raises(ValueError, match=rf"batch_size must be in \[1, 2\*\*64\), got {bad}"):
            Sampler(10, bad)
        with pytest.raises(ValueError, match=rf"length must be in \[1, 2\*\*64\), got {bad}"):
            Sampler(bad, 2)
    for bad in (2.0, True):
        with pytest.raises(TypeError, match="batch_size must be an int"):
            Sampler(10, bad)  # type: ignore[arg-type]
    assert Sampler(10, np.int16(2)).batch_size == 2


@pytest.mark.parametrize("mode", ["sequential", "iid", "cyclic"])
def test_a_sampler_state_resumes_at_its_step_and_refuses_another_configuration(
    mode: str,
) -> None:
    import json

    from chute.errors import StateMismatchError

    s = Sampler(100, 8, mode, seed=3)
    s.seek(41)
    state = json.loads(json.dumps(s.state_dict()))
    assert state["step"] == 41 and state["seed"] == 3 and state["sampler"] == mode
    fresh = Sampler(100, 8, mode, seed=3)
    fresh.load_state_dict(state)
    assert fresh.step == 41
    np.testing.assert_array_equal(next(fresh), s.indices(41))
    with pytest.raises(StateMismatchError, match="seed: saved 3, current 4") as info:
        Sampler(100, 8, mode, seed=4).load_state_dict(state)
    assert info.value.differences == {"seed": (3, 4)}
    weighted = WeightedSampler(np.ones(100), 8, seed=3)
    with pytest.raises(StateMismatchError, match="sampler: saved") as info:
        weighted.load_state_dict(state)
    assert set(info.value.differences) == {"sampler"}
    with pytest.raises(TypeError, match="saved step must be an int"):
        fresh.load_state_dict({**state, "step": 2.5})


def test_the_compiled_sampler_has_the_mode_codes_of_python_and_loaderx() -> None:
    from chute._native import sampler_codes
    from chute.loader._sampler import _MODES

    compiled = {
        "sequential": sampler_codes.MODE_SEQUENTIAL,
        "iid": sampler_codes.MODE_IID,
        "cyclic": sampler_codes.MODE_CYCLIC,
    }
    assert compiled == _MODES == {"sequential": 0, "iid": 1, "cyclic": 2}  # loaderx's codes
