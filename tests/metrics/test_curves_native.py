"""The compiled curve kernels behind `ema` and `thin`: equal to plain numpy definitions on
any input, and hostile buffers refused with an exception (checked in a forked child, so a
stray read that crashes fails the test instead of the run)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from chute import _native
from chute.metrics._smooth import ema, thin
from tests.store.isolate import OK, WRONG_DATA, run_isolated


def ema_reference(values, factor, state=(0.0, 0.0)):
    acc, weight = state
    out = []
    for v in values:
        if np.isfinite(v):
            acc = factor * acc + (1 - factor) * v
            weight = factor * weight + (1 - factor)
        out.append(acc / weight if weight > 0 else np.nan)
    return np.array(out), acc, weight


def thin_reference(x, y, buckets, span=None):
    """first, last, first least and first greatest row of each bucket (NaN ignored)."""
    n = len(x)
    if n <= 4 * buckets:
        return np.arange(n)
    x0, x1 = (x[0], x[-1]) if span is None else span
    if x1 > x0:
        edges = np.searchsorted(x, np.linspace(x0, x1, buckets + 1)[:-1], side="left")
    else:
        edges = np.linspace(0, n, buckets + 1).astype(np.int64)[:-1]
    starts = sorted({int(e) for e in edges if e < n})
    keep = set()
    for a, b in zip(starts, [*starts[1:], n], strict=True):
        part = y[a:b]
        keep |= {a, b - 1}
        if np.isnan(part).all():
            continue
        keep |= {a + int(np.nanargmin(part)), a + int(np.nanargmax(part))}
    return np.array(sorted(keep))


values = st.lists(
    st.one_of(st.floats(-1e6, 1e6), st.just(float("nan")), st.sampled_from([0.0, -0.0, 1.0])),
    max_size=400,
)


@settings(max_examples=300, deadline=None)
@given(values, st.floats(0, 0.999), st.tuples(st.floats(-10, 10), st.floats(0, 1)))
def test_ema_equals_the_recurrence(y, factor, state):
    got = ema(np.array(y, dtype=np.float64), factor, state)
    want = ema_reference(y, factor, state)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-9)
    assert np.isclose(got[1], want[1]) and np.isclose(got[2], want[2])


@settings(max_examples=200, deadline=None)
@given(values, st.floats(0, 0.999), st.data())
def test_ema_at_some_rows_is_the_whole_ema_there(y, factor, data):
    y = np.array(y, dtype=np.float64)
    at = np.array(sorted(data.draw(st.sets(st.integers(0, max(0, len(y) - 1)))) if len(y) else []))
    whole = ema(y, factor)
    part = ema(y, factor, at=at.astype(np.int64))
    np.testing.assert_array_equal(part[0], whole[0][at.astype(np.int64)])
    assert part[1:] == whole[1:]


@settings(max_examples=300, deadline=None)
@given(values, st.integers(1, 40), st.booleans(), st.integers(0, 3))
def test_thin_keeps_each_buckets_first_last_and_extremes(y, buckets, with_span, repeats):
    y = np.array(y, dtype=np.float64)
    x = np.sort(np.floor(np.arange(len(y)) / (repeats + 1)).astype(np.float64))
    span = (x[0] - 1.5, x[-1] + 2.0) if with_span and len(x) else None
    np.testing.assert_array_equal(thin(x, y, buckets, span), thin_reference(x, y, buckets, span))


def test_misaligned_and_strided_columns_are_taken_as_they_come():
    """A column mapped from an archive member can sit at any byte offset."""
    y = np.random.default_rng(0).normal(size=5000)
    raw = np.zeros(5000 * 8 + 1, np.uint8)
    raw[1:] = y.view(np.uint8)
    odd = raw[1:].view(np.float64)  # misaligned by one byte
    assert not odd.flags.aligned
    x = np.arange(5000.0)
    np.testing.assert_array_equal(thin(x, odd, 50), thin(x, y, 50))
    np.testing.assert_array_equal(ema(odd, 0.9)[0], ema(y, 0.9)[0])
    np.testing.assert_array_equal(ema(y[::2], 0.9)[0], ema(y[::2].copy(), 0.9)[0])


def test_hostile_buffers_are_refused_not_read():
    def child() -> int:
        y = np.arange(10.0)
        out = np.empty(40, np.int64)
        bad = [
            lambda: _native.extremes(y.astype(np.float32), np.array([0], np.int64), out),
            lambda: _native.extremes(y, np.array([0], np.int32), out),
            lambda: _native.extremes(y, np.array([0, 99], np.int64), out),  # past the end
            lambda: _native.extremes(y, np.array([-1], np.int64), out),
            lambda: _native.extremes(y, np.array([3, 3], np.int64), out),  # not increasing
            lambda: _native.extremes(y, np.arange(5, dtype=np.int64), out[:8]),  # out short
            lambda: _native.extremes(y[::2], np.array([0], np.int64), out),  # not contiguous
            lambda: _native.extremes(y, np.array([0], np.int64), out.astype(np.float64)),
            lambda: _native.ema(y, 0.5, 0.0, 0.0, np.empty(3), None),  # out of another length
            lambda: _native.ema(y, 1.5, 0.0, 0.0, np.empty(10), None),
            lambda: _native.ema(y, 0.5, 0.0, 0.0, np.empty(10).view(np.int64), None),
            lambda: _native.ema(y, 0.5, 0.0, 0.0, b"x" * 80, None),  # read-only out
            lambda: _native.ema(y.view(np.uint8)[1:81], 0.5, 0.0, 0.0, np.empty(10), None),
            lambda: _native.ema(y, 0.5, 0.0, 0.0, np.empty(2), np.array([3, 10])),  # past the end
            lambda: _native.ema(y, 0.5, 0.0, 0.0, np.empty(2), np.array([4, 4])),
            lambda: _native.ema(y, 0.5, 0.0, 0.0, np.empty(1), np.array([-1])),
            lambda: _native.ema(y, 0.5, 0.0, 0.0, np.empty(3), np.array([1, 2])),  # out long
            lambda: _native.ema(y, 0.5, 0.0, 0.0, np.empty(2), np.array([1, 2], np.int32)),
        ]
        for call in bad:
            try:
                call()
            except (ValueError, TypeError, BufferError):
                continue
            return WRONG_DATA
        return OK

    assert run_isolated(child) == OK
