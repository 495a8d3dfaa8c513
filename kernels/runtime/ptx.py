"""Inline-PTX helpers every CuTe DSL kernel here uses (imports cutlass: load lazily).

:func:`inline_ptx` emits one ``llvm.inline_asm`` block; :func:`asm_u32` is its common form
(32-bit register operands, one 32-bit result); :func:`prefetch_l2` is a plain L2 prefetch.
The kernels' own instruction sequences live beside them (``quantize.ptx``, ``gemm_sm90/``).
"""

from __future__ import annotations

from cutlass import Int32, Int64
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op


def inline_ptx(asm: str, constraints: str, operands, result_type, side_effects=False, *, loc, ip):
    """One inline-PTX block: MLIR ``operands``, one result of ``result_type`` (None: none,
    then it is kept only with ``side_effects``)."""
    return llvm.inline_asm(
        result_type,
        operands,
        asm,
        constraints,
        has_side_effects=side_effects,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


def asm_u32(asm: str, constraints: str, *args: Int32, loc=None, ip=None) -> Int32:
    """One inline-PTX block with 32-bit register operands and one 32-bit result."""
    operands = [Int32(a).ir_value(loc=loc, ip=ip) for a in args]
    i32 = ir.IntegerType.get_signless(32)
    return Int32(inline_ptx(asm, constraints, operands, i32, loc=loc, ip=ip))


@dsl_user_op
def prefetch_l2(addr, *, loc=None, ip=None) -> None:
    """Hint: bring the line holding global byte address ``addr`` into L2. It changes no
    value anyone reads (L2 is the GPU's point of coherence for global memory), so it may be
    issued before a programmatic-dependent-launch wait."""
    operand = Int64(addr).ir_value(loc=loc, ip=ip)
    inline_ptx("prefetch.global.L2 [$0];", "l", [operand], None, True, loc=loc, ip=ip)
