"""The SM90 GEMM's host side: a call's refusal, plan and compile (``gemm``), what only a
W8A16 call has (``w8a16``), the buffers kept per stream and the launches before a GEMM
(``buffers``)."""
