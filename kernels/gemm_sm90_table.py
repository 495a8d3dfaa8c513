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
        (1, "swap-ab bf16-tokens"),  # 0.0827 ms, 0.58x
        (8, "swap-ab bf16-tokens"),  # 0.0828 ms, 0.57x
        (16, "swap-ab bf16-tokens mc2"),  # 0.0833 ms, 0.57x
        (32, "swap-ab bf16-tokens mc2"),  # 0.0883 ms, 0.58x
        (48, "swap-ab w128 bf16-tokens"),  # 0.1079 ms, 0.69x
        (64, "swap-ab w128 bf16-tokens"),  # 0.1116 ms, 0.71x
        (96, "tiled 128x128 c2 stream-k"),  # 0.1505 ms, 0.94x
        (128, "tiled 128x128 c2 stream-k"),  # 0.1558 ms, 0.96x
        (192, "tiled 192x128 c1 stream-k"),  # 0.2200 ms, 1.17x
        (256, "tiled 128x128 c2 stream-k"),  # 0.2854 ms, 1.29x
        (384, "tiled 192x128 c1"),  # 0.4272 ms, 1.32x
        (512, "tiled 128x128 c2 stream-k"),  # 0.6177 ms, 1.39x
        (1024, "tiled 192x128 c1"),  # 1.2034 ms, 1.27x
        (2048, "tiled 192x128 c1"),  # 2.0898 ms, 1.21x
        (4096, "tiled 192x128 c1"),  # 4.1953 ms, 1.23x
        (8192, "tiled 192x128 c1"),  # 8.0515 ms, 1.16x
        (16384, "tiled 192x128 c1"),  # 16.1286 ms, 1.21x
    ),
    (4096, 12288): (
        (1, "swap-ab"),  # 0.0201 ms, 0.67x
        (8, "swap-ab"),  # 0.0200 ms, 0.66x
        (16, "swap-ab"),  # 0.0211 ms, 0.72x
        (32, "swap-ab bf16-tokens mc2"),  # 0.0232 ms, 0.77x
        (48, "swap-ab w128 bf16-tokens"),  # 0.0336 ms, 1.09x
        (64, "swap-ab w128 bf16-tokens"),  # 0.0346 ms, 1.08x
        (96, "tiled 128x128 c2 stream-k"),  # 0.0420 ms, 1.23x
        (128, "tiled 128x128 c2 stream-k"),  # 0.0432 ms, 1.29x
        (192, "tiled 192x128 c1 stream-k"),  # 0.0567 ms, 1.04x
        (256, "tiled 128x128 c2 stream-k"),  # 0.0613 ms, 1.44x
        (384, "tiled 128x128 c2 stream-k"),  # 0.0839 ms, 1.34x
        (512, "tiled 128x128 c2"),  # 0.0915 ms, 1.35x
        (1024, "tiled 128x128 c2"),  # 0.1752 ms, 1.37x
        (2048, "tiled 128x128 c2"),  # 0.3700 ms, 1.42x
        (4096, "tiled 128x128 c2"),  # 0.7671 ms, 1.36x
        (8192, "tiled 192x128 c1"),  # 1.4158 ms, 1.22x
        (16384, "tiled 192x128 c1"),  # 2.8991 ms, 1.23x
    ),
    (7168, 14336): (
        (1, "swap-ab"),  # 0.0333 ms, 0.62x
        (8, "swap-ab"),  # 0.0330 ms, 0.60x
        (16, "swap-ab bf16-tokens mc2"),  # 0.0333 ms, 0.58x
        (32, "swap-ab bf16-tokens mc2"),  # 0.0359 ms, 0.64x
        (48, "swap-ab w128 bf16-tokens"),  # 0.0465 ms, 0.81x
        (64, "swap-ab w128 bf16-tokens"),  # 0.0474 ms, 0.84x
        (96, "tiled 128x128 c2 stream-k"),  # 0.0638 ms, 1.06x
        (128, "tiled 128x128 c2 stream-k"),  # 0.0660 ms, 1.07x
        (192, "tiled 192x128 c1 stream-k"),  # 0.0921 ms, 1.30x
        (256, "tiled 128x128 c2"),  # 0.1030 ms, 1.36x
        (384, "tiled 192x128 c1"),  # 0.1413 ms, 1.34x
        (512, "tiled 128x128 c2 stream-k"),  # 0.1985 ms, 1.43x
        (1024, "tiled 128x128 c2 stream-k"),  # 0.3990 ms, 1.37x
        (2048, "tiled 192x128 c1"),  # 0.7359 ms, 1.30x
        (4096, "tiled 192x128 c1"),  # 1.4538 ms, 1.28x
        (8192, "tiled 192x128 c1"),  # 2.8109 ms, 1.21x
        (16384, "tiled 192x128 c1"),  # 5.9887 ms, 1.29x
    ),
    (7168, 18432): (
        (1, "swap-ab"),  # 0.0405 ms, 0.60x
        (8, "swap-ab"),  # 0.0405 ms, 0.56x
        (16, "swap-ab bf16-tokens mc2"),  # 0.0402 ms, 0.57x
        (32, "swap-ab bf16-tokens mc2"),  # 0.0441 ms, 0.64x
        (48, "swap-ab w128 bf16-tokens"),  # 0.0565 ms, 0.78x
        (64, "swap-ab w128 bf16-tokens"),  # 0.0580 ms, 0.79x
        (96, "tiled 128x128 c2 stream-k"),  # 0.0779 ms, 1.07x
        (128, "tiled 128x128 c2 stream-k"),  # 0.0803 ms, 1.07x
        (192, "tiled 192x128 c1 stream-k"),  # 0.1110 ms, 1.27x
        (256, "tiled 128x128 c2"),  # 0.1283 ms, 1.34x
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
        (8, "swap-ab"),  # 0.0404 ms, 0.58x
        (16, "swap-ab bf16-tokens mc2"),  # 0.0400 ms, 0.56x
        (32, "swap-ab bf16-tokens mc2"),  # 0.0430 ms, 0.61x
        (48, "swap-ab w128 bf16-tokens"),  # 0.0518 ms, 0.73x
        (64, "swap-ab w128 bf16-tokens"),  # 0.0523 ms, 0.81x
        (96, "tiled 128x128 c2 stream-k"),  # 0.0760 ms, 1.13x
        (128, "swap-ab w128 bf16-tokens"),  # 0.0784 ms, 1.16x
        (192, "tiled 192x128 c1 stream-k"),  # 0.1158 ms, 1.27x
        (256, "tiled 128x128 c2 stream-k"),  # 0.1424 ms, 1.50x
        (384, "tiled 128x128 c2 stream-k"),  # 0.1995 ms, 1.45x
        (512, "tiled 128x128 c2 stream-k"),  # 0.2589 ms, 1.42x
        (1024, "tiled 192x128 c1"),  # 0.5064 ms, 1.41x
        (2048, "tiled 192x128 c1"),  # 0.9424 ms, 1.27x
        (4096, "tiled 192x128 c1"),  # 1.8912 ms, 1.29x
        (8192, "tiled 192x128 c1"),  # 3.7760 ms, 1.25x
        (16384, "tiled 192x128 c1"),  # 7.8803 ms, 1.39x
    ),
    (2048, 7168): (
        (1, "swap-ab"),  # 0.0107 ms, 0.86x
        (8, "swap-ab"),  # 0.0108 ms, 0.87x
        (16, "swap-ab"),  # 0.0114 ms, 0.90x
        (32, "swap-ab"),  # 0.0141 ms, 1.10x
        (48, "tiled 64x64 c1 stream-k s11+4 bf16"),  # 0.0207 ms, 1.57x
        (64, "tiled 64x64 c1 stream-k s11+4 bf16"),  # 0.0199 ms, 1.60x
        (96, "tiled 128x64 c1 stream-k"),  # 0.0238 ms, 1.76x
        (128, "tiled 128x64 c1 stream-k"),  # 0.0239 ms, 1.62x
        (192, "tiled 128x64 c1 stream-k"),  # 0.0320 ms, 2.17x
        (256, "tiled 128x64 c1 stream-k"),  # 0.0316 ms, 2.14x
        (384, "tiled 128x128 c2 stream-k"),  # 0.0385 ms, 1.54x
        (512, "tiled 128x128 c2 stream-k"),  # 0.0441 ms, 1.89x
        (1024, "tiled 128x128 c2"),  # 0.0589 ms, 1.50x
        (2048, "tiled 128x128 c2"),  # 0.1132 ms, 1.49x
        (4096, "tiled 128x128 c2"),  # 0.2208 ms, 1.46x
        (8192, "tiled 128x128 c2 stream-k"),  # 0.4390 ms, 1.41x
        (16384, "tiled 128x128 c2 stream-k"),  # 0.9176 ms, 1.42x
    ),
}
