"""Measured GEMM configs (gemm_sm90.choose_config) per weight shape (N, K) and token count.

Written by ``python benchmarks/gemm.py --tune --write-table kernels/gemm_sm90_table.py`` on
the H200 (132 SMs): per (tokens, N, K) the fastest candidate by CUDA Graph replay, medians
of interleaved rounds (receipt: benchmarks/results/gemm_tune.json). Each row is (measured
token count, spec); a call takes the row of the smallest measured token count at or above
its own (gemm_sm90.table_spec). Shapes not listed take gemm_sm90.heuristic_config.
"""

NUM_SMS = 132

TABLE: dict[tuple[int, int], tuple[tuple[int, str], ...]] = {}
