"""The CPU reference GEMM's order of additions: BLAS's by default (not thread-invariant, as
documented), a fixed exact order under ``torch.use_deterministic_algorithms(True)``."""

import pytest
import torch

from mxfp8_fusion import reference


@pytest.fixture
def deterministic():
    threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(threads)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    av, asc = reference.quantize(a)
    bv, bsc = reference.quantize(b)
    return reference.mm(av, asc, bv, bsc, None, torch.float32)


def test_fixed_order_keeps_what_cancellation_would_lose(deterministic):
    """Groups of 2**40, 1 and -2**40: summed group by group in FP64 the ones survive (32);
    an FP32 running sum drops them against 2**40 and gives 0."""
    big = 2.0**40
    a = torch.cat([torch.full((1, 32), big), torch.ones(1, 32), torch.full((1, 32), -big)], 1)
    b = torch.ones(1, 96)
    assert _mm(a.bfloat16(), b.bfloat16()).item() == 32.0


def test_fixed_order_is_the_same_for_any_thread_count(deterministic):
    gen = torch.Generator().manual_seed(0)

    def wide(rows: int, k: int) -> torch.Tensor:
        exponents = torch.randint(-60, 60, (rows, k // 32, 1), generator=gen).float()
        values = torch.randn(rows, k // 32, 32, generator=gen) * torch.exp2(exponents)
        return values.view(rows, k).bfloat16()

    a, b = wide(48, 1024), wide(40, 1024)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        results.append(_mm(a, b))
    assert torch.equal(results[0].view(torch.int32), results[1].view(torch.int32))
    torch.use_deterministic_algorithms(False)
    blas = _mm(a, b)  # the default path: the same sums up to FP32 rounding
    # an FP32 sum of K products is within K * 2**-24 * sum |products| of the exact one (the
    # BLAS's blocking, and so which outputs cancel most, depends on the CPU it runs on)
    a_exact = reference.dequantize(*reference.quantize(a)).double()
    b_exact = reference.dequantize(*reference.quantize(b)).double()
    bound = a.shape[1] * 2.0**-24 * (a_exact.abs() @ b_exact.abs().T)
    assert ((results[0].double() - blas.double()).abs() <= bound).all()
