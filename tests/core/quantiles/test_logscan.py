"""Segmented log-sum-exp scans: both code paths against a plain per-segment accumulate."""

import numpy as np
import pytest

from dpq_spark.core.quantiles import _logscan as L


def reference(z, starts, reverse=False):
    ends = np.append(starts[1:], z.size)
    parts = []
    for a, b in zip(starts, ends):
        seg = z[a:b][::-1] if reverse else z[a:b]
        acc = np.logaddexp.accumulate(seg)
        parts.append(acc[::-1] if reverse else acc)
    return np.concatenate(parts)


@pytest.mark.parametrize("size, nseg", [(1, 1), (50, 3), (5_000, 10), (20_000, 1), (20_000, 300), (30_000, 30_000)])
@pytest.mark.parametrize("scale", [1.0, 400.0])  # 400: rows spanning > 690 nats take the exact fallback
def test_scans_match_reference(size, nseg, scale):
    rng = np.random.default_rng(size + nseg)
    z = rng.normal(0.0, scale, size)
    z[rng.random(size) < 0.05] = -np.inf
    starts = np.concatenate(([0], np.sort(rng.choice(np.arange(1, size), nseg - 1, replace=False)))) if nseg > 1 else np.array([0])
    starts = starts.astype(np.int64)
    for reverse, fn in [(False, L.segmented_logcumsumexp), (True, L.segmented_logcumsumexp_reverse)]:
        got, want = fn(z, starts), reference(z, starts, reverse)
        assert np.array_equal(np.isfinite(got), np.isfinite(want))
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=1e-13, atol=1e-12)


def test_fast_logaddexp_matches_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 300, 10_000), rng.normal(0, 300, 10_000)
    a[:10] = -np.inf
    b[5:15] = -np.inf
    got, want = L.logaddexp(a, b), np.logaddexp(a, b)
    assert np.array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-14, atol=1e-13)


@pytest.mark.parametrize("size, nseg", [(1, 1), (50, 3), (5_000, 10), (20_000, 1), (20_000, 300), (30_000, 30_000)])
@pytest.mark.parametrize("scale", [1.0, 400.0])
def test_joint_scans_match_reference_and_depend_on_their_segment_only(size, nseg, scale):
    """segmented_scans (the three scans of a JointExp step): each output against the plain
    accumulate, and bit for bit the same when its segment is scanned with other segments around
    it (rows of 32 and of 512, carries across rows, the exact fallback for wide rows)."""
    rng = np.random.default_rng(size + nseg + 7)
    zp, zm = rng.normal(0.0, scale, size), rng.normal(0.0, scale, size)
    zp[rng.random(size) < 0.05] = -np.inf
    starts = np.concatenate(([0], np.sort(rng.choice(np.arange(1, size), nseg - 1, replace=False)))) if nseg > 1 else np.array([0])
    starts = starts.astype(np.int64)
    got = L.segmented_scans(zp, zm, starts)
    for out, want in zip(got, (reference(zp, starts), reference(zm, starts), reference(zm, starts, True))):
        assert np.array_equal(np.isfinite(out), np.isfinite(want))
        fin = np.isfinite(want)
        np.testing.assert_allclose(out[fin], want[fin], rtol=1e-13, atol=1e-12)
    ends = np.append(starts[1:], size)
    for s in rng.choice(starts.size, min(starts.size, 5), replace=False).tolist():
        a, b = int(starts[s]), int(ends[s])
        alone = L.segmented_scans(zp[a:b], zm[a:b], np.array([0]))
        for out, one in zip(got, alone):
            assert np.array_equal(out[a:b], one)
