"""The tiled GEMM kernel: whole output tiles (or stream-K units) per persistent CTA."""
