"""Measured GEMM schedules (gemm_select.choose_config) per weight shape (N, K) and
token count: data the tuner writes, not edited by hand. Regenerate on an H200 (132
SMs) with

    python benchmarks/gemm.py --tune --rounds 5 --out benchmarks/results/gemm_tune.json --write-table kernels/gemm_sm90/table.py

Measured on the NVIDIA H200 at revision e6e8cef (receipt: benchmarks/results/
gemm_tune.json): per (tokens, N, K) the fastest candidate that matched the reference,
by CUDA Graph replay, medians of interleaved rounds (the comments: its name in the
receipt, its time and its ratio to cuBLAS BF16's time). Each row is (measured token
count, schedule fields: gemm_select.config_of); a call takes the row of the smallest
measured token count at or above its own. Shapes not listed take
gemm_select.heuristic_config."""

RECEIPT = "benchmarks/results/gemm_tune.json"
NUM_SMS = 132

# fmt: off
TABLE: dict[tuple[int, int], tuple[tuple[int, dict], ...]] = {
    (7168, 43008): (
        # swap-ab bf16-tokens: 0.0827 ms, 0.58x
        (1, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': True, 'tile_w': 64, 'cluster': 1}),
        # swap-ab bf16-tokens: 0.0828 ms, 0.57x
        (8, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': True, 'tile_w': 64, 'cluster': 1}),
        # swap-ab bf16-tokens mc2: 0.0833 ms, 0.57x
        (16, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': True, 'tile_w': 64, 'cluster': 2}),
        # swap-ab bf16-tokens mc2: 0.0883 ms, 0.58x
        (32, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': True, 'tile_w': 64, 'cluster': 2}),
        # swap-ab w128 bf16-tokens: 0.1075 ms, 0.67x
        (48, {'kernel': 'swap-ab', 'consumers': 2, 'bf16_tokens': True, 'tile_w': 128, 'cluster': 1}),
        # swap-ab w128 bf16-tokens: 0.1118 ms, 0.69x
        (64, {'kernel': 'swap-ab', 'consumers': 2, 'bf16_tokens': True, 'tile_w': 128, 'cluster': 1}),
        # tiled 128x128 c2 stream-k: 0.1458 ms, 0.90x
        (96, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 128x128 c2 stream-k: 0.1492 ms, 0.88x
        (128, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 192x128 c1 stream-k: 0.1938 ms, 1.04x
        (192, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 1}),
        # tiled 128x128 c2 stream-k: 0.2736 ms, 1.25x
        (256, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 192x128 c1 stream-k: 0.3730 ms, 1.20x
        (384, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 1}),
        # tiled 192x128 c1 stream-k-tail: 0.5296 ms, 1.26x
        (512, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 1.0750 ms, 1.16x
        (1024, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 1.9654 ms, 1.20x
        (2048, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 3.8715 ms, 1.21x
        (4096, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 7.6959 ms, 1.21x
        (8192, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 15.2316 ms, 1.21x
        (16384, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
    ),
    (4096, 12288): (
        # swap-ab: 0.0201 ms, 0.67x
        (1, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': False, 'tile_w': 64, 'cluster': 1}),
        # swap-ab: 0.0200 ms, 0.66x
        (8, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': False, 'tile_w': 64, 'cluster': 1}),
        # swap-ab: 0.0211 ms, 0.72x
        (16, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': False, 'tile_w': 64, 'cluster': 1}),
        # swap-ab bf16-tokens mc2: 0.0232 ms, 0.77x
        (32, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': True, 'tile_w': 64, 'cluster': 2}),
        # swap-ab w128 bf16-tokens: 0.0335 ms, 1.07x
        (48, {'kernel': 'swap-ab', 'consumers': 2, 'bf16_tokens': True, 'tile_w': 128, 'cluster': 1}),
        # tiled 128x128 c2 stream-k: 0.0335 ms, 1.04x
        (64, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 128x128 c2 stream-k: 0.0399 ms, 1.19x
        (96, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 128x128 c2 stream-k: 0.0399 ms, 1.19x
        (128, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 192x128 c1 stream-k: 0.0490 ms, 0.99x
        (192, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 1}),
        # tiled 128x128 c2 stream-k-tail: 0.0580 ms, 1.37x
        (256, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k: 0.0746 ms, 1.21x
        (384, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 1}),
        # tiled 128x128 c2: 0.0839 ms, 1.25x
        (512, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 0}),
        # tiled 128x128 c2: 0.1609 ms, 1.26x
        (1024, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 0}),
        # tiled 192x128 c1 stream-k-tail: 0.3267 ms, 1.29x
        (2048, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 0.6592 ms, 1.24x
        (4096, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 1.2952 ms, 1.18x
        (8192, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 2.7309 ms, 1.20x
        (16384, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
    ),
    (7168, 14336): (
        # swap-ab: 0.0333 ms, 0.62x
        (1, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': False, 'tile_w': 64, 'cluster': 1}),
        # swap-ab: 0.0330 ms, 0.60x
        (8, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': False, 'tile_w': 64, 'cluster': 1}),
        # swap-ab bf16-tokens mc2: 0.0333 ms, 0.58x
        (16, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': True, 'tile_w': 64, 'cluster': 2}),
        # swap-ab bf16-tokens mc2: 0.0359 ms, 0.64x
        (32, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': True, 'tile_w': 64, 'cluster': 2}),
        # swap-ab w128 bf16-tokens: 0.0464 ms, 0.78x
        (48, {'kernel': 'swap-ab', 'consumers': 2, 'bf16_tokens': True, 'tile_w': 128, 'cluster': 1}),
        # swap-ab w128 bf16-tokens: 0.0474 ms, 0.83x
        (64, {'kernel': 'swap-ab', 'consumers': 2, 'bf16_tokens': True, 'tile_w': 128, 'cluster': 1}),
        # tiled 128x128 c2 stream-k: 0.0604 ms, 0.97x
        (96, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 128x128 c2 stream-k: 0.0608 ms, 0.97x
        (128, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 192x128 c1 stream-k: 0.0771 ms, 1.13x
        (192, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 1}),
        # tiled 128x128 c2: 0.0948 ms, 1.29x
        (256, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 0}),
        # tiled 192x128 c1: 0.1312 ms, 1.26x
        (384, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 0}),
        # tiled 192x128 c1 stream-k-tail: 0.1807 ms, 1.32x
        (512, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 0.3643 ms, 1.25x
        (1024, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 0.6716 ms, 1.23x
        (2048, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 1.3182 ms, 1.20x
        (4096, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 2.6266 ms, 1.19x
        (8192, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 5.3984 ms, 1.21x
        (16384, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
    ),
    (7168, 18432): (
        # swap-ab: 0.0405 ms, 0.60x
        (1, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': False, 'tile_w': 64, 'cluster': 1}),
        # swap-ab: 0.0405 ms, 0.56x
        (8, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': False, 'tile_w': 64, 'cluster': 1}),
        # swap-ab bf16-tokens mc2: 0.0402 ms, 0.57x
        (16, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': True, 'tile_w': 64, 'cluster': 2}),
        # swap-ab bf16-tokens mc2: 0.0441 ms, 0.64x
        (32, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': True, 'tile_w': 64, 'cluster': 2}),
        # swap-ab w128 bf16-tokens: 0.0545 ms, 0.72x
        (48, {'kernel': 'swap-ab', 'consumers': 2, 'bf16_tokens': True, 'tile_w': 128, 'cluster': 1}),
        # swap-ab w128 bf16-tokens: 0.0556 ms, 0.74x
        (64, {'kernel': 'swap-ab', 'consumers': 2, 'bf16_tokens': True, 'tile_w': 128, 'cluster': 1}),
        # tiled 128x128 c2 stream-k: 0.0721 ms, 0.94x
        (96, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 128x128 c2 stream-k: 0.0727 ms, 0.94x
        (128, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 192x128 c1 stream-k: 0.0940 ms, 1.10x
        (192, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 1}),
        # tiled 128x128 c2: 0.1209 ms, 1.28x
        (256, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 0}),
        # tiled 192x128 c1 stream-k: 0.1659 ms, 1.25x
        (384, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 1}),
        # tiled 192x128 c1 stream-k-tail: 0.2296 ms, 1.30x
        (512, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 0.4659 ms, 1.22x
        (1024, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 0.8529 ms, 1.22x
        (2048, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 1.6916 ms, 1.20x
        (4096, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 3.3669 ms, 1.19x
        (8192, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 6.8817 ms, 1.22x
        (16384, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
    ),
    (18432, 7168): (
        # swap-ab: 0.0404 ms, 0.58x
        (1, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': False, 'tile_w': 64, 'cluster': 1}),
        # swap-ab: 0.0404 ms, 0.58x
        (8, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': False, 'tile_w': 64, 'cluster': 1}),
        # swap-ab bf16-tokens mc2: 0.0400 ms, 0.56x
        (16, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': True, 'tile_w': 64, 'cluster': 2}),
        # swap-ab bf16-tokens mc2: 0.0430 ms, 0.61x
        (32, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': True, 'tile_w': 64, 'cluster': 2}),
        # swap-ab w128 bf16-tokens: 0.0519 ms, 0.73x
        (48, {'kernel': 'swap-ab', 'consumers': 2, 'bf16_tokens': True, 'tile_w': 128, 'cluster': 1}),
        # swap-ab w128 bf16-tokens: 0.0522 ms, 0.80x
        (64, {'kernel': 'swap-ab', 'consumers': 2, 'bf16_tokens': True, 'tile_w': 128, 'cluster': 1}),
        # tiled 128x128 c2 stream-k: 0.0706 ms, 1.04x
        (96, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 128x128 c2 stream-k: 0.0699 ms, 1.02x
        (128, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 192x128 c1 stream-k: 0.0927 ms, 1.04x
        (192, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 1}),
        # tiled 128x128 c2 stream-k: 0.1272 ms, 1.38x
        (256, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 192x128 c1 stream-k-tail: 0.1692 ms, 1.25x
        (384, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 0.2373 ms, 1.32x
        (512, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 0.4556 ms, 1.29x
        (1024, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 0.8484 ms, 1.18x
        (2048, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 1.7096 ms, 1.20x
        (4096, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 3.4209 ms, 1.19x
        (8192, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 7.0439 ms, 1.24x
        (16384, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
    ),
    (2048, 7168): (
        # swap-ab: 0.0107 ms, 0.86x
        (1, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': False, 'tile_w': 64, 'cluster': 1}),
        # swap-ab: 0.0108 ms, 0.87x
        (8, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': False, 'tile_w': 64, 'cluster': 1}),
        # swap-ab: 0.0114 ms, 0.90x
        (16, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': False, 'tile_w': 64, 'cluster': 1}),
        # swap-ab: 0.0141 ms, 1.10x
        (32, {'kernel': 'swap-ab', 'consumers': 3, 'bf16_tokens': False, 'tile_w': 64, 'cluster': 1}),
        # tiled 128x64 c1 stream-k bf16: 0.0194 ms, 1.49x
        (48, {'kernel': 'tiled', 'fp16_tiles': False, 'tile_m': 128, 'tile_n': 64, 'converters': 1, 'stream_k': 1}),
        # tiled 64x64 c1 stream-k s11+4 bf16: 0.0199 ms, 1.54x
        (64, {'kernel': 'tiled', 'fp16_tiles': False, 'stages': [11, 4], 'tile_m': 64, 'tile_n': 64, 'converters': 1, 'stream_k': 1}),
        # tiled 128x64 c1 stream-k bf16: 0.0225 ms, 1.69x
        (96, {'kernel': 'tiled', 'fp16_tiles': False, 'tile_m': 128, 'tile_n': 64, 'converters': 1, 'stream_k': 1}),
        # tiled 128x64 c1 stream-k bf16: 0.0226 ms, 1.52x
        (128, {'kernel': 'tiled', 'fp16_tiles': False, 'tile_m': 128, 'tile_n': 64, 'converters': 1, 'stream_k': 1}),
        # tiled 128x64 c1 stream-k: 0.0302 ms, 2.05x
        (192, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 64, 'converters': 1, 'stream_k': 1}),
        # tiled 128x64 c1 stream-k: 0.0299 ms, 2.03x
        (256, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 64, 'converters': 1, 'stream_k': 1}),
        # tiled 128x128 c2 stream-k: 0.0366 ms, 1.51x
        (384, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 128x128 c2 stream-k: 0.0411 ms, 1.76x
        (512, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 1}),
        # tiled 128x128 c2: 0.0521 ms, 1.33x
        (1024, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 0}),
        # tiled 128x128 c2: 0.0970 ms, 1.31x
        (2048, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 0}),
        # tiled 128x128 c2: 0.1900 ms, 1.29x
        (4096, {'kernel': 'tiled', 'tile_m': 128, 'tile_n': 128, 'converters': 2, 'stream_k': 0}),
        # tiled 192x128 c1 stream-k-tail: 0.3879 ms, 1.29x
        (8192, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
        # tiled 192x128 c1 stream-k-tail: 0.8089 ms, 1.26x
        (16384, {'kernel': 'tiled', 'tile_m': 192, 'tile_n': 128, 'converters': 1, 'stream_k': 2}),
    ),
}
# fmt: on
