"""Inline-PTX helpers every CuTe DSL kernel here uses (imports cutlass: load lazily).

:func:`inline_ptx` emits one ``llvm.inline_asm`` block; :func:`asm_u32` is its common form
(32-bit register operands, one 32-bit result); :func:`prefetch_l2` is a plain L2 prefetch.
:func:`store_globaltimer` writes the GPU's nanosecond clock, :func:`clock64` reads the SM's
cycle counter and :func:`add_global_u64` adds to a global counter (in-kernel timing
diagnostics).
The kernels' own instruction sequences live beside them (``quantize_ptx``, ``gemm_sm90_*``).
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


@dsl_user_op
def store_globaltimer(addr, *, loc=None, ip=None) -> None:
    """Write ``%globaltimer`` (nanoseconds, one clock for the whole GPU) as a 64-bit integer
    to global byte address ``addr``."""
    i64 = ir.IntegerType.get_signless(64)
    now = inline_ptx("mov.u64 $0, %globaltimer;", "=l", [], i64, True, loc=loc, ip=ip)
    operands = [Int64(addr).ir_value(loc=loc, ip=ip), now]
    inline_ptx("st.global.u64 [$0], $1;", "l,l", operands, None, True, loc=loc, ip=ip)


@dsl_user_op
def clock64(*, loc=None, ip=None) -> Int64:
    """The SM's cycle counter ``%clock64`` (volatile: it stays in order with the waits around
    it)."""
    i64 = ir.IntegerType.get_signless(64)
    return Int64(inline_ptx("mov.u64 $0, %clock64;", "=l", [], i64, True, loc=loc, ip=ip))


@dsl_user_op
def add_global_u64(addr, value, *, loc=None, ip=None) -> None:
    """``*addr += value`` on a 64-bit global counter at byte address ``addr`` (atomic)."""
    operands = [Int64(addr).ir_value(loc=loc, ip=ip), Int64(value).ir_value(loc=loc, ip=ip)]
    inline_ptx("red.global.add.u64 [$0], $1;", "l,l", operands, None, True, loc=loc, ip=ip)
