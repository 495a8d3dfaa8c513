"""How the SM90 GEMM's config is chosen and tuned: the choice (``select``), the measured
table (``table``), the GPU-proven schedules (``proven``), the tune's search space
(``search``). No torch, no cutlass."""
