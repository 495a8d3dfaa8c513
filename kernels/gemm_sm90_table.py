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
        (48, "swap-ab w128 bf16-tokens"),  # 0.1075 ms, 0.67x
        (64, "swap-ab w128 bf16-tokens"),  # 0.1118 ms, 0.69x
        (96, "tiled 128x128 c2 stream-k"),  # 0.1458 ms, 0.90x
        (128, "tiled 128x128 c2 stream-k"),  # 0.1492 ms, 0.88x
        (192, "tiled 192x128 c1 stream-k"),  # 0.2143 ms, 1.12x
        (256, "tiled 128x128 c2"),  # 0.2764 ms, 1.21x
        (384, "tiled 192x128 c1"),  # 0.4093 ms, 1.28x
        (512, "tiled 128x128 c2 stream-k"),  # 0.6069 ms, 1.37x
        (1024, "tiled 128x128 c2"),  # 1.1819 ms, 1.26x
        (2048, "tiled 192x128 c1"),  # 2.0610 ms, 1.19x
        (4096, "tiled 192x128 c1"),  # 4.0954 ms, 1.19x
        (8192, "tiled 192x128 c1"),  # 7.9183 ms, 1.12x
        (16384, "tiled 192x128 c1"),  # 16.2238 ms, 1.24x
    ),
    (4096, 12288): (
        (1, "swap-ab"),  # 0.0201 ms, 0.67x
        (8, "swap-ab"),  # 0.0200 ms, 0.66x
        (16, "swap-ab"),  # 0.0211 ms, 0.72x
        (32, "swap-ab bf16-tokens mc2"),  # 0.0232 ms, 0.77x
        (48, "swap-ab w128 bf16-tokens"),  # 0.0335 ms, 1.07x
        (64, "tiled 128x128 c2 stream-k"),  # 0.0335 ms, 1.04x
        (96, "tiled 128x128 c2 stream-k"),  # 0.0399 ms, 1.19x
        (128, "tiled 128x128 c2 stream-k"),  # 0.0399 ms, 1.19x
        (192, "tiled 192x128 c1 stream-k"),  # 0.0522 ms, 1.14x
        (256, "tiled 128x128 c2 stream-k"),  # 0.0581 ms, 1.35x
        (384, "tiled 128x128 c2 stream-k"),  # 0.0791 ms, 1.39x
        (512, "tiled 128x128 c2"),  # 0.0842 ms, 1.23x
        (1024, "tiled 128x128 c2"),  # 0.1621 ms, 1.26x
        (2048, "tiled 128x128 c2"),  # 0.3465 ms, 1.34x
        (4096, "tiled 128x128 c2"),  # 0.7163 ms, 1.29x
        (8192, "tiled 192x128 c1"),  # 1.3671 ms, 1.21x
        (16384, "tiled 192x128 c1"),  # 2.7941 ms, 1.21x
    ),
    (7168, 14336): (
        (1, "swap-ab"),  # 0.0333 ms, 0.62x
        (8, "swap-ab"),  # 0.0330 ms, 0.60x
        (16, "swap-ab bf16-tokens mc2"),  # 0.0333 ms, 0.58x
        (32, "swap-ab bf16-tokens mc2"),  # 0.0359 ms, 0.64x
        (48, "swap-ab w128 bf16-tokens"),  # 0.0464 ms, 0.78x
        (64, "swap-ab w128 bf16-tokens"),  # 0.0474 ms, 0.83x
        (96, "tiled 128x128 c2 stream-k"),  # 0.0604 ms, 0.97x
        (128, "tiled 128x128 c2 stream-k"),  # 0.0608 ms, 0.97x
        (192, "tiled 192x128 c1 stream-k"),  # 0.0845 ms, 1.18x
        (256, "tiled 128x128 c2"),  # 0.0960 ms, 1.25x
        (384, "tiled 192x128 c1"),  # 0.1318 ms, 1.24x
        (512, "tiled 128x128 c2 stream-k"),  # 0.1904 ms, 1.35x
        (1024, "tiled 128x128 c2 stream-k"),  # 0.3890 ms, 1.32x
        (2048, "tiled 192x128 c1"),  # 0.6934 ms, 1.18x
        (4096, "tiled 192x128 c1"),  # 1.3826 ms, 1.19x
        (8192, "tiled 192x128 c1"),  # 2.7131 ms, 1.16x
        (16384, "tiled 192x128 c1"),  # 5.6372 ms, 1.18x
    ),
    (7168, 18432): (
        (1, "swap-ab"),  # 0.0405 ms, 0.60x
        (8, "swap-ab"),  # 0.0405 ms, 0.56x
        (16, "swap-ab bf16-tokens mc2"),  # 0.0402 ms, 0.57x
        (32, "swap-ab bf16-tokens mc2"),  # 0.0441 ms, 0.64x
        (48, "swap-ab w128 bf16-tokens"),  # 0.0545 ms, 0.72x
        (64, "swap-ab w128 bf16-tokens"),  # 0.0556 ms, 0.74x
        (96, "tiled 128x128 c2 stream-k"),  # 0.0721 ms, 0.94x
        (128, "tiled 128x128 c2 stream-k"),  # 0.0727 ms, 0.94x
        (192, "tiled 192x128 c1 stream-k"),  # 0.1029 ms, 1.14x
        (256, "tiled 128x128 c2"),  # 0.1219 ms, 1.24x
        (384, "tiled 192x128 c1"),  # 0.1692 ms, 1.24x
        (512, "tiled 128x128 c2 stream-k"),  # 0.2421 ms, 1.34x
        (1024, "tiled 128x128 c2 stream-k"),  # 0.5159 ms, 1.33x
        (2048, "tiled 192x128 c1"),  # 0.9138 ms, 1.23x
        (4096, "tiled 192x128 c1"),  # 1.7536 ms, 1.16x
        (8192, "tiled 192x128 c1"),  # 3.5115 ms, 1.14x
        (16384, "tiled 192x128 c1"),  # 7.4520 ms, 1.23x
    ),
    (18432, 7168): (
        (1, "swap-ab"),  # 0.0404 ms, 0.58x
        (8, "swap-ab"),  # 0.0404 ms, 0.58x
        (16, "swap-ab bf16-tokens mc2"),  # 0.0400 ms, 0.56x
        (32, "swap-ab bf16-tokens mc2"),  # 0.0430 ms, 0.61x
        (48, "swap-ab w128 bf16-tokens"),  # 0.0519 ms, 0.73x
        (64, "swap-ab w128 bf16-tokens"),  # 0.0522 ms, 0.80x
        (96, "tiled 128x128 c2 stream-k"),  # 0.0706 ms, 1.04x
        (128, "tiled 128x128 c2 stream-k"),  # 0.0699 ms, 1.02x
        (192, "tiled 192x128 c1 stream-k"),  # 0.1007 ms, 1.10x
        (256, "tiled 128x128 c2 stream-k"),  # 0.1292 ms, 1.34x
        (384, "tiled 128x128 c2 stream-k"),  # 0.1842 ms, 1.32x
        (512, "tiled 128x128 c2 stream-k"),  # 0.2416 ms, 1.31x
        (1024, "tiled 192x128 c1"),  # 0.4683 ms, 1.28x
        (2048, "tiled 192x128 c1"),  # 0.8695 ms, 1.15x
        (4096, "tiled 192x128 c1"),  # 1.7572 ms, 1.15x
        (8192, "tiled 192x128 c1"),  # 3.5569 ms, 1.16x
        (16384, "tiled 192x128 c1"),  # 7.3681 ms, 1.26x
    ),
    (2048, 7168): (
        (1, "swap-ab"),  # 0.0107 ms, 0.86x
        (8, "swap-ab"),  # 0.0108 ms, 0.87x
        (16, "swap-ab"),  # 0.0114 ms, 0.90x
        (32, "swap-ab"),  # 0.0141 ms, 1.10x
        (48, "tiled 128x64 c1 stream-k bf16"),  # 0.0194 ms, 1.49x
        (64, "tiled 64x64 c1 stream-k s11+4 bf16"),  # 0.0199 ms, 1.54x
        (96, "tiled 128x64 c1 stream-k bf16"),  # 0.0225 ms, 1.69x
        (128, "tiled 128x64 c1 stream-k bf16"),  # 0.0226 ms, 1.52x
        (192, "tiled 128x64 c1 stream-k"),  # 0.0296 ms, 2.01x
        (256, "tiled 128x64 c1 stream-k"),  # 0.0300 ms, 1.78x
        (384, "tiled 128x128 c2 stream-k"),  # 0.0363 ms, 1.53x
        (512, "tiled 128x128 c2 stream-k"),  # 0.0409 ms, 1.66x
        (1024, "tiled 128x128 c2"),  # 0.0517 ms, 1.30x
        (2048, "tiled 128x128 c2"),  # 0.0970 ms, 1.30x
        (4096, "tiled 128x128 c2"),  # 0.1953 ms, 1.31x
        (8192, "tiled 128x128 c2"),  # 0.4172 ms, 1.36x
        (16384, "tiled 192x128 c1"),  # 0.8380 ms, 1.27x
    ),
}
