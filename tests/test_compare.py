import math

import torch

from shardfuzz.compare import Tolerance, compare_tensor


def _cmp(actual, expected, bound=1e-6):
    e = torch.tensor(expected, dtype=torch.float64)
    return compare_tensor(torch.tensor(actual), e, torch.full_like(e, bound), 0, lambda i: i)


def test_within_and_beyond_tolerance():
    assert _cmp([1.0, 2.0], [1.0, 2.0 + 5e-7]).bad == 0
    rd = _cmp([1.0, 2.5], [1.0, 2.0])
    assert rd.bad == 1 and rd.max_abs_at == (1,) and math.isclose(rd.max_abs, 0.5)


def test_nan_and_inf_policy():
    assert _cmp([float("nan")], [float("nan")]).bad == 0
    assert _cmp([float("inf")], [float("inf")]).bad == 0
    assert _cmp([float("-inf")], [float("inf")]).bad == 1
    assert _cmp([float("nan")], [1.0]).bad == 1
    assert _cmp([1.0], [float("nan")]).bad == 1
    assert _cmp([float("inf")], [1.0]).max_ratio == math.inf


def test_bound_scales_with_dtype_noise_and_magnitude():
    tol = Tolerance()
    ref = torch.tensor([1.0, 0.0], dtype=torch.float64)
    low = torch.tensor([1.0, 0.0], dtype=torch.float32)
    b32 = tol.bound(ref, low, None, "float32", 2)
    b16 = tol.bound(ref, low, None, "bfloat16", 2)
    assert (b16 > 1000 * b32).all()
    # a cancelling element: the result is 0 but its terms were large
    mag = torch.tensor([1.0, 100.0], dtype=torch.float64)
    assert tol.bound(ref, low, mag, "float32", 2)[1] > 50 * b32[1]
    noisy = torch.tensor([1.001, 0.0], dtype=torch.float32)
    assert tol.bound(ref, noisy, None, "float32", 2)[0] >= 4 * 0.00099
