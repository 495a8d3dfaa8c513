"""Measured GEMM configs (gemm_sm90.choose_config) per weight shape (N, K) and token count.

Regenerate on an H200 (132 SMs) with

    python benchmarks/gemm.py --tune --rounds 5 --out benchmarks/results/gemm_tune.json --write-table kernels/gemm_sm90_table.py

Measured on the NVIDIA H200 (the receipt, benchmarks/results/gemm_tune.json,
names the revision): per (tokens, N, K) the fastest candidate that matched the
reference, by CUDA Graph replay, medians of interleaved rounds (the comments: its time
and its ratio to cuBLAS BF16's time). Each row is (measured token count, spec); a call
takes the row of the smallest measured token count at or above its own
(gemm_sm90.table_spec). Shapes not listed take gemm_sm90.heuristic_config."""

NUM_SMS = 132

TABLE: dict[tuple[int, int], tuple[tuple[int, str], ...]] = {
    (7168, 43008): (
        (1, "swap-ab"),  # 0.0839 ms, 0.57x
        (8, "swap-ab"),  # 0.0839 ms, 0.56x
        (16, "swap-ab"),  # 0.0867 ms, 0.57x
        (32, "swap-ab"),  # 0.1101 ms, 0.71x
        (48, "tiled 128x128 c2 stream-k"),  # 0.1186 ms, 0.74x
        (64, "tiled 128x128 c2 stream-k"),  # 0.1205 ms, 0.75x
        (96, "tiled 128x128 c2 stream-k"),  # 0.1528 ms, 0.94x
        (128, "tiled 128x128 c2 stream-k"),  # 0.1582 ms, 0.95x
        (192, "tiled 192x128 c1 stream-k"),  # 0.2240 ms, 1.14x
        (256, "tiled 128x128 c2 stream-k"),  # 0.2917 ms, 1.25x
        (384, "tiled 192x128 c1"),  # 0.4272 ms, 1.32x
        (512, "tiled 128x128 c2 stream-k"),  # 0.6177 ms, 1.39x
        (1024, "tiled 192x128 c1"),  # 1.2034 ms, 1.27x
        (2048, "tiled 192x128 c1"),  # 2.0898 ms, 1.21x
        (4096, "tiled 192x128 c1"),  # 4.1953 ms, 1.23x
        (8192, "tiled 192x128 c1"),  # 8.0515 ms, 1.16x
        (16384, "tiled 192x128 c1"),  # 16.1286 ms, 1.21x
    ),
    (4096, 12288): (
        (1, "swap-ab"),  # 0.0208 ms, 0.68x
        (8, "swap-ab"),  # 0.0208 ms, 0.68x
        (16, "swap-ab"),  # 0.0210 ms, 0.72x
        (32, "swap-ab"),  # 0.0267 ms, 0.89x
        (48, "tiled 128x128 c2 stream-k"),  # 0.0390 ms, 1.26x
        (64, "tiled 128x128 c2 stream-k"),  # 0.0382 ms, 1.20x
        (96, "tiled 128x128 c2 stream-k"),  # 0.0451 ms, 1.32x
        (128, "tiled 128x64 c1 stream-k"),  # 0.0449 ms, 1.34x
        (192, "tiled 192x128 c1 stream-k"),  # 0.0602 ms, 1.16x
        (256, "tiled 128x128 c2 stream-k"),  # 0.0627 ms, 1.43x
        (384, "tiled 128x128 c2 stream-k"),  # 0.0854 ms, 1.51x
        (512, "tiled 128x128 c2"),  # 0.0944 ms, 1.36x
        (1024, "tiled 128x128 c2"),  # 0.1827 ms, 1.40x
        (2048, "tiled 128x128 c2"),  # 0.3700 ms, 1.42x
        (4096, "tiled 128x128 c2"),  # 0.7671 ms, 1.36x
        (8192, "tiled 192x128 c1"),  # 1.4158 ms, 1.22x
        (16384, "tiled 192x128 c1"),  # 2.8991 ms, 1.23x
    ),
    (7168, 14336): (
        (1, "swap-ab"),  # 0.0337 ms, 0.63x
        (8, "swap-ab"),  # 0.0337 ms, 0.61x
        (16, "swap-ab"),  # 0.0353 ms, 0.61x
        (32, "swap-ab"),  # 0.0438 ms, 0.78x
        (48, "tiled 128x128 c2 stream-k"),  # 0.0551 ms, 0.97x
        (64, "tiled 128x128 c2 stream-k"),  # 0.0540 ms, 0.96x
        (96, "tiled 128x128 c2 stream-k"),  # 0.0661 ms, 1.10x
        (128, "tiled 128x128 c2 stream-k"),  # 0.0684 ms, 1.11x
        (192, "tiled 192x128 c1 stream-k"),  # 0.0947 ms, 1.30x
        (256, "tiled 128x128 c2"),  # 0.1083 ms, 1.38x
        (384, "tiled 192x128 c1"),  # 0.1417 ms, 1.30x
        (512, "tiled 128x128 c2 stream-k"),  # 0.2027 ms, 1.42x
        (1024, "tiled 128x128 c2 stream-k"),  # 0.4075 ms, 1.39x
        (2048, "tiled 192x128 c1"),  # 0.7359 ms, 1.30x
        (4096, "tiled 192x128 c1"),  # 1.4538 ms, 1.28x
        (8192, "tiled 192x128 c1"),  # 2.8109 ms, 1.21x
        (16384, "tiled 192x128 c1"),  # 5.9887 ms, 1.29x
    ),
    (7168, 18432): (
        (1, "swap-ab"),  # 0.0408 ms, 0.59x
        (8, "swap-ab"),  # 0.0406 ms, 0.55x
        (16, "swap-ab"),  # 0.0421 ms, 0.59x
        (32, "swap-ab"),  # 0.0536 ms, 0.74x
        (48, "tiled 128x128 c2 stream-k"),  # 0.0619 ms, 0.81x
        (64, "tiled 128x128 c2 stream-k"),  # 0.0626 ms, 0.84x
        (96, "tiled 128x128 c2 stream-k"),  # 0.0784 ms, 1.05x
        (128, "tiled 128x128 c2 stream-k"),  # 0.0813 ms, 1.07x
        (192, "tiled 192x128 c1 stream-k"),  # 0.1133 ms, 1.24x
        (256, "tiled 128x128 c2 stream-k"),  # 0.1347 ms, 1.34x
        (384, "tiled 192x128 c1"),  # 0.1772 ms, 1.28x
        (512, "tiled 128x128 c2 stream-k"),  # 0.2554 ms, 1.39x
        (1024, "tiled 128x128 c2 stream-k"),  # 0.5398 ms, 1.40x
        (2048, "tiled 192x128 c1"),  # 0.9272 ms, 1.27x
        (4096, "tiled 192x128 c1"),  # 1.8469 ms, 1.26x
        (8192, "tiled 192x128 c1"),  # 3.6049 ms, 1.22x
        (16384, "tiled 192x128 c1"),  # 7.5219 ms, 1.25x
    ),
    (18432, 7168): (
        (1, "swap-ab"),  # 0.0404 ms, 0.58x
        (8, "swap-ab"),  # 0.0403 ms, 0.57x
        (16, "swap-ab"),  # 0.0424 ms, 0.60x
        (32, "swap-ab"),  # 0.0538 ms, 0.77x
        (48, "tiled 128x128 c2 stream-k"),  # 0.0763 ms, 1.08x
        (64, "tiled 64x128 c2 stream-k"),  # 0.0615 ms, 0.95x
        (96, "tiled 128x128 c2 stream-k"),  # 0.0760 ms, 1.13x
        (128, "tiled 128x128 c2 stream-k"),  # 0.0805 ms, 1.18x
        (192, "tiled 192x128 c1 stream-k"),  # 0.1169 ms, 1.27x
        (256, "tiled 128x128 c2 stream-k"),  # 0.1449 ms, 1.47x
        (384, "tiled 128x128 c2 stream-k"),  # 0.2031 ms, 1.43x
        (512, "tiled 128x128 c2 stream-k"),  # 0.2646 ms, 1.41x
        (1024, "tiled 192x128 c1"),  # 0.5083 ms, 1.39x
        (2048, "tiled 192x128 c1"),  # 0.9424 ms, 1.27x
        (4096, "tiled 192x128 c1"),  # 1.8912 ms, 1.29x
        (8192, "tiled 192x128 c1"),  # 3.7760 ms, 1.25x
        (16384, "tiled 192x128 c1"),  # 7.8803 ms, 1.39x
    ),
    (2048, 7168): (
        (1, "swap-ab"),  # 0.0132 ms, 1.02x
        (8, "swap-ab"),  # 0.0132 ms, 1.07x
        (16, "swap-ab"),  # 0.0140 ms, 1.11x
        (32, "swap-ab"),  # 0.0173 ms, 1.34x
        (48, "tiled 128x64 c1 stream-k"),  # 0.0272 ms, 2.07x
        (64, "tiled 128x64 c1 stream-k"),  # 0.0252 ms, 2.03x
        (96, "tiled 128x64 c1 stream-k"),  # 0.0269 ms, 2.01x
        (128, "tiled 128x64 c1 stream-k"),  # 0.0269 ms, 1.79x
        (192, "tiled 128x64 c1 stream-k"),  # 0.0336 ms, 2.27x
        (256, "tiled 128x64 c1 stream-k"),  # 0.0330 ms, 2.16x
        (384, "tiled 128x128 c2 stream-k"),  # 0.0417 ms, 1.71x
        (512, "tiled 128x64 c1"),  # 0.0430 ms, 1.83x
        (1024, "tiled 128x128 c2"),  # 0.0601 ms, 1.49x
        (2048, "tiled 128x128 c2"),  # 0.1132 ms, 1.49x
        (4096, "tiled 128x128 c2"),  # 0.2208 ms, 1.46x
        (8192, "tiled 128x128 c2 stream-k"),  # 0.4390 ms, 1.41x
        (16384, "tiled 128x128 c2 stream-k"),  # 0.9176 ms, 1.42x
    ),
}
