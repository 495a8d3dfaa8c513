"""The tiled GEMM's consumer role (tiled.kernel; imports cutlass: load lazily).

Consumer warpgroups own 64 rows of the output tile each (k-split 64-row tiles: the same rows,
one K half of every FP8 stage each). Per K 64 a consumer converts its A rows from the TMA'd
FP8 stage straight into the register fragments of an RS wgmma (BF16, or FP16 with the rows'
reference exponents: gemm_sm90.device.f16) and runs four m64 x tile_n x k16 wgmmas against the
converted 16-bit B stage. At the end of a segment it unscales the sums (FP16 path), then
stores them, or under stream-K keeps them as its tile's tail or publishes them; the fixup
adds the lower CTAs' published parts in K order and stores the tile.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32
from cutlass.cute.nvgpu import warpgroup

from ....format import CHUNK_BYTES, ROW_BLOCK
from ..constants import TILE_K8, TILE_K16, UNROLL_CHUNK, WG_THREADS
from ..device.common import (
    add_parts,
    convert_fragment,
    load_fragment_bytes,
    load_smem_words,
    quad_transpose,
    store_flag,
    wait_flag,
)
from ..device.f16 import RING_TO_LOW, times_pow2
from .schedule import HALVES, REF_STAGES, TiledSchedule


class ConsumerRole(TiledSchedule):
    """The consumer warpgroups' methods of MXFP8TiledGemmSm90. They read the tile geometry
    and work split of :class:`TiledSchedule` (the tile shape, ``k_split``, ``row_blocks``,
    ``consumers``, ``a_chunks``, the stage counts, ``stream_k``, the ring offsets,
    ``_my_units``, ``_segment``, ``_tiles``, ``_tile_mn``) and :class:`Sm90Gemm`
    (``k_tiles``, ``n``, ``has_bias``)."""

    @cute.jit
    def _consumer(
        self, cwg, ct, mmas, st, sBs, mD, mBias, m, load_pipe, conv_pipe, ref_pipe, mPartials,
        mFlags,
    ):  # fmt: skip
        refs = st.refs.data_ptr().toint()
        for mma in mmas:  # accumulate from the first wgmma on: acc is zeroed per tile
            mma.set(warpgroup.Field.ACCUMULATE, True)
        thr = mmas[0].get_slice(ct)
        acc = cute.make_rmem_tensor(thr.partition_shape_C((64, self.tile_n)), cutlass.Float32)
        lane = ct % 32
        wg_row = 0 if cutlass.const_expr(self.k_split) else cwg * 64  # its first tile row
        row0 = wg_row + (ct // 32) * 16 + lane // 4  # rows row0, row0 + 8 of the A tile
        cta, _, _ = cute.arch.block_idx()

        u, stop, hop = self._my_units(m)
        ls = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages8)
        rs = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages16)
        rel = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages16)
        if cutlass.const_expr(self.k_split):
            # consumer c reads the 16-bit stages of K half c: c, c + 2, ...
            n16 = self.stages16
            rs = pipeline.PipelineState(n16, cwg, cwg % n16, (cwg // n16) % 2)
            rel = pipeline.PipelineState(n16, cwg, cwg % n16, (cwg // n16) % 2)
        rfs = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, REF_STAGES)
        owned = Int32(-1)  # stream-K: the tile whose tail this CTA holds for the final fixup
        while u < stop:
            t, tm, tn, k0, k1, seg_end = self._segment(u, stop, m)
            ref_pipe.consumer_wait(rfs)
            buf = refs + rfs.index * (self.ref_words * 4)
            mode = load_smem_words(buf + self.mode_word * 4, 1, 4)[0]
            scale_row0 = (tm * self.tile_m) % ROW_BLOCK  # tile row 0 within its first chunk
            if tm * self.tile_m + wg_row < m:
                acc.fill(0.0)
                # the FP16 factors want ref - 15 (f16_factor)
                row_lows = [
                    Int32(load_smem_words(buf + (row0 + 8 * rr) * 4, 1, 4)[0]) + RING_TO_LOW
                    for rr in range(2)
                ]
                args = (ct, acc, st, row0, scale_row0, load_pipe, conv_pipe, k1 - k0)
                if cutlass.const_expr(self.k_split):
                    if cwg == 0:
                        ls, rs, rel = self._mainloops(
                            mode, mmas, sBs, ls, rs, rel, row_lows, 0, args
                        )
                    else:
                        ls, rs, rel = self._mainloops(
                            mode, mmas, sBs, ls, rs, rel, row_lows, 1, args
                        )
                else:
                    ls, rs, rel = self._mainloops(
                        mode, mmas, sBs, ls, rs, rel, row_lows, None, args
                    )
                warpgroup.wait_group(0)
                conv_pipe.consumer_release(rel)
                for _s in cutlass.range_constexpr(self._stride16()):
                    rel.advance()
                part = (acc, thr, buf, row0, mode, t, tm, tn, k0, k1, cwg, ct, cta, m)
                if cutlass.const_expr(self.k_split):
                    self._add_halves(cwg, ct, cta, acc, mPartials)
                    if cwg == 0:
                        owned = self._finish_part(part, mD, mBias, mPartials, mFlags, owned)
                else:
                    owned = self._finish_part(part, mD, mBias, mPartials, mFlags, owned)
            else:  # every row of this warpgroup lies past M
                ls, rs, rel = self._skip_segment(load_pipe, conv_pipe, ls, rs, rel, k1 - k0)
            ref_pipe.consumer_release(rfs)
            rfs.advance()
            u = self._next_unit(seg_end, hop)
        if cutlass.const_expr(self.stream_k):
            if owned >= 0:
                self._fixup(cwg, ct, cta, owned, thr, acc, mD, mBias, m, mPartials, mFlags)

    @cute.jit
    def _skip_segment(self, load_pipe, conv_pipe, ls, rs, rel, k_stages):
        """A segment whose rows of this warpgroup all lie past M: wait for and release its
        ``k_stages`` stages without computing, so the pipelines stay in step. Returns the
        advanced ``ls``, ``rs`` and ``rel``."""
        for _kt in range(k_stages):
            load_pipe.consumer_wait(ls)
            for _h in cutlass.range_constexpr(HALVES // self._stride16()):
                conv_pipe.consumer_wait(rs)
                conv_pipe.consumer_release(rs)
                for _s in cutlass.range_constexpr(self._stride16()):
                    rs.advance()
                    rel.advance()
            load_pipe.consumer_release(ls)
            ls.advance()
        return ls, rs, rel

    def _stride16(self) -> int:
        """16-bit stages a consumer's pipeline states advance per stage it reads."""
        return HALVES if self.k_split else 1

    @cute.jit
    def _mainloops(self, mode, mmas, sBs, ls, rs, rel, row_lows, k_half, args):
        """The segment's K loop on the tile's path: BF16 (mode 1) or FP16."""
        ct, acc, st, row0, scale_row0, load_pipe, conv_pipe, k_stages = args
        if cutlass.const_expr(self.bf16_path_only):
            ls, rs, rel = self._mainloop(
                ct, mmas[0], sBs[0], acc, st, row0, scale_row0, load_pipe, conv_pipe,
                ls, rs, rel, None, k_stages, k_half,
            )  # fmt: skip
        elif mode != 0:
            ls, rs, rel = self._mainloop(
                ct, mmas[0], sBs[0], acc, st, row0, scale_row0, load_pipe, conv_pipe,
                ls, rs, rel, None, k_stages, k_half,
            )  # fmt: skip
        else:
            ls, rs, rel = self._mainloop(
                ct, mmas[1], sBs[1], acc, st, row0, scale_row0, load_pipe, conv_pipe,
                ls, rs, rel, row_lows, k_stages, k_half,
            )  # fmt: skip
        return ls, rs, rel

    @cute.jit
    def _add_halves(self, cwg, ct, cta, acc, mPartials):
        """k-split: the second consumer's sums join the first's, in a fixed order (first +
        second) so that every call sums alike. They pass through this CTA's second workspace
        slot (L2; gemm_sm90.workspace gives k-split tiles two), which leaves the shared
        memory to deeper pipelines; a named barrier orders the two warpgroups' global
        accesses (CTA scope)."""
        both = 2 * WG_THREADS
        if cwg == 1:
            for i0 in cutlass.range_constexpr(0, cute.size(acc), UNROLL_CHUNK):
                for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, cute.size(acc))):
                    mPartials[i, ct, 0, 1, cta] = acc[i]
        cute.arch.barrier(barrier_id=1 + self.consumers, number_of_threads=both)
        if cwg == 0:
            for i0 in cutlass.range_constexpr(0, cute.size(acc), UNROLL_CHUNK):
                for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, cute.size(acc))):
                    acc[i] = acc[i] + mPartials[i, ct, 0, 1, cta]
        # the next segment may overwrite the block only after the first consumer has read it
        cute.arch.barrier(barrier_id=1 + self.consumers, number_of_threads=both)

    @cute.jit
    def _finish_part(self, part, mD, mBias, mPartials, mFlags, owned):
        """A segment's sums of one 64-row block: unscaled (FP16 path), then stored (a whole
        tile, or persistent), kept as this CTA's tail, or published (stream-K). Returns the
        tile whose tail this CTA now holds (``owned`` if none)."""
        acc, thr, buf, row0, mode, t, tm, tn, k0, k1, cwg, ct, cta, m = part
        row_base = tm * self.tile_m + (0 if cutlass.const_expr(self.k_split) else cwg * 64)
        # every part is unscaled before it is stored or added: the factors are powers of
        # two, so the sum of unscaled parts is the unscaled sum
        if cutlass.const_expr(not self.bf16_path_only):
            if mode == 0:
                self._unscale(acc, thr, buf, row0)
        if cutlass.const_expr(self.stream_k):
            if k0 == 0 and k1 == self.k_tiles:  # the whole tile: no other CTA holds a part
                self._epilogue(acc, thr, mD, mBias, m, row_base, tn)
            elif k1 == self.k_tiles:
                # the tile's tail: the fixup adds the lower CTAs' parts at the end
                for i0 in cutlass.range_constexpr(0, cute.size(acc), UNROLL_CHUNK):
                    for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, cute.size(acc))):
                        mPartials[i, ct, 1, cwg, cta] = acc[i]
                owned = t
            else:
                # head or middle of the tile: publish it for the CTA holding the tail
                for i0 in cutlass.range_constexpr(0, cute.size(acc), UNROLL_CHUNK):
                    for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, cute.size(acc))):
                        mPartials[i, ct, 0, cwg, cta] = acc[i]
                cute.arch.fence_acq_rel_gpu()
                cute.arch.barrier(barrier_id=1 + cwg, number_of_threads=WG_THREADS)
                if ct == 0:
                    store_flag(mFlags.iterator + (cwg + self.row_blocks * cta), 1)
        else:
            self._epilogue(acc, thr, mD, mBias, m, row_base, tn)
        return owned

    @cute.jit
    def _fixup(self, cwg, ct, cta, tile, thr, acc, mD, mBias, m, mPartials, mFlags):
        """Stream-K: sum the tile's parts of this warpgroup's rows in K order (the published
        heads and middles of the lower CTAs, then this CTA's tail) and store them. Waits only
        on lower CTAs, which publish before their own fixup and start no later, so every
        wait ends."""
        grid, _, _ = cute.arch.grid_dim()
        units = self._tiles(m) * self.k_tiles
        unit0 = tile * self.k_tiles
        if cutlass.const_expr(self.sk_tail):
            # only tiles past the whole ones are split, over the units past them
            whole, units = self._waves(m)
            unit0 = unit0 - whole * self.k_tiles
        # the CTA holding the tile's first unit (as _my_units splits them)
        first = Int32(((cutlass.Int64(unit0) + 1) * grid - 1) // units)
        flags = mFlags.iterator + cwg
        # the lower parts' flags awaited together (a thread each), then the parts loaded
        # several at a time (add_parts) and added in K order: awaited and loaded one at a
        # time, each part was an L2 round trip of its own behind the last one (common's
        # FIXUP_FLOATS)
        for c in range(first + ct, cta, WG_THREADS):
            wait_flag(flags + self.row_blocks * c)
        cute.arch.barrier(barrier_id=1 + cwg, number_of_threads=WG_THREADS)
        cute.arch.fence_acq_rel_gpu()
        acc.fill(0.0)
        add_parts(acc, first, cta, lambda c: mPartials[None, ct, 0, cwg, c])
        for i0 in cutlass.range_constexpr(0, cute.size(acc), UNROLL_CHUNK):
            for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, cute.size(acc))):
                acc[i] = acc[i] + mPartials[i, ct, 1, cwg, cta]
        tm, tn = self._tile_mn(tile, m)
        row_base = tm * self.tile_m + (0 if cutlass.const_expr(self.k_split) else cwg * 64)
        self._epilogue(acc, thr, mD, mBias, m, row_base, tn)
        # every thread has read the parts: re-arm the flags for the next launch
        cute.arch.barrier(barrier_id=1 + cwg, number_of_threads=WG_THREADS)
        for c in range(first + ct, cta, WG_THREADS):
            store_flag(flags + self.row_blocks * c, 0)

    @cute.jit
    def _mainloop(
        self, ct, tiled_mma, sB16, acc, st, row0, scale_row0, load_pipe, conv_pipe, ls, rs, rel,
        row_lows, k_stages, k_half=None,
    ):  # fmt: skip
        """One segment's K loop over ``k_stages`` FP8 stages: per K 64 (only half ``k_half`` of
        each stage where given: k-split), convert A into the fragment (FP16 with
        ``row_lows``, else BF16), then four wgmmas against the converted B stage. Leaves the
        last wgmmas in flight and the last B stage unreleased."""
        thr = tiled_mma.get_slice(ct)
        frag = tiled_mma.make_fragment_A(thr.partition_shape_A((64, TILE_K16)))
        # Int32 view: word rr + 2 * hi + 4 * kb = the pair (row g + 8 rr, k 2t + 8 hi) of
        # k16 block kb, the register order of the RS wgmma's A fragment
        frag_words = cute.recast_tensor(frag, Int32)
        tCrB = tiled_mma.make_fragment_B(thr.partition_B(sB16))
        a8 = st.sA.data_ptr().toint()
        sa = st.sSA.data_ptr().toint()
        t = ct % 4
        halves = [h for h in range(HALVES) if k_half is None or h == k_half]
        stride = self._stride16()
        for _kt in range(k_stages):
            load_pipe.consumer_wait(ls)
            for h in halves:
                conv_pipe.consumer_wait(rs)
                groups = (2 * h, 2 * h + 1)  # the K half's scale groups
                words, scales = self._load_a_half(a8, sa, ls, h, row0, t, groups, scale_row0)
                # the fragment is overwritten next: wait for the previous half's wgmmas, which
                # read it (and their B stage), only now, so that this half's shared-memory
                # loads overlap them
                warpgroup.wait_group(0)
                rel = self._place_a_half(
                    words, scales, groups, frag_words, row_lows, conv_pipe, rel, rs, load_pipe,
                    ls, h == halves[-1],
                )  # fmt: skip
                warpgroup.fence()
                for kb in cutlass.range_constexpr(TILE_K16 // 16):
                    cute.gemm(
                        tiled_mma,
                        acc,
                        frag[(None, None, kb)],
                        tCrB[(None, None, kb, rs.index)],
                        acc,
                    )
                warpgroup.commit_group()
                rel = self._after_half_issued(conv_pipe, rel, rs, load_pipe, ls, h == halves[-1])
                for _s in cutlass.range_constexpr(stride):
                    rs.advance()
            ls.advance()
        return ls, rs, rel

    # --- what a variant overrides (the W8A16 one: tiled/w8a16.py's SlicesA) ---------------

    bf16_path_only = False
    """Whether every tile takes the BF16 path: then no FP16 mainloop or unscale is built."""

    def _load_a_half(self, a8, sa, ls, h, row0, t, groups, scale_row0):
        """This thread's A bytes of K half ``h`` of stage ``ls.index`` and their scales."""
        return load_fragment_bytes(
            a8 + ls.index * (self.tile_m * TILE_K8), row0, t, groups,
            sa + ls.index * (self.a_chunks * CHUNK_BYTES), scale_row0, self.a_chunks,
        )  # fmt: skip

    def _place_a_half(
        self, words, scales, groups, frag_words, row_lows, conv_pipe, rel, rs, load_pipe, ls,
        last,
    ):  # fmt: skip
        """A's half into the fragment, after the previous half's wgmmas (``wait_group``):
        converted from FP8, which consumes the loads, so the 16-bit B stage behind and, after
        the last half, the FP8 stage are released here. Returns the advanced ``rel``."""
        rel = self._release_b16(conv_pipe, rel, rs)
        convert_fragment(words, scales, groups, frag_words, row_lows)
        if last:
            load_pipe.consumer_release(ls)
        return rel

    def _after_half_issued(self, conv_pipe, rel, rs, load_pipe, ls, last):
        """After the half's wgmmas are issued: nothing more for FP8 A. Returns ``rel``."""
        return rel

    @cute.jit
    def _release_b16(self, conv_pipe, rel, rs):
        """Release the 16-bit B stage a half behind ``rs`` (its wgmmas are done: called after
        ``wait_group(0)``), if there is one. Returns the advanced ``rel``."""
        if rel.count < rs.count:
            conv_pipe.consumer_release(rel)
            for _s in cutlass.range_constexpr(self._stride16()):
                rel.advance()
        return rel

    @cute.jit
    def _unscale(self, acc, thr, buf, row0):
        """FP16 path: times 2**(ref_a - 127) * 2**(ref_b - 127), the factors the conversion
        took out of each row of A and of B (exact: powers of two, see times_pow2)."""
        coords = thr.partition_C(cute.make_identity_tensor((64, self.tile_n)))
        a_exp = [Int32(load_smem_words(buf + (row0 + 8 * rr) * 4, 1, 4)[0]) for rr in range(2)]
        for i0 in cutlass.range_constexpr(0, cute.size(acc), UNROLL_CHUNK):
            for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, cute.size(acc))):
                r, c = coords[i]
                b_exp = Int32(load_smem_words(buf + (self.b_ref0 + c) * 4, 1, 4)[0])
                # the thread's rows are row0 and row0 + 8: r % 16 tells which
                e = cutlass.select_(r % 16 < 8, a_exp[0], a_exp[1]) + b_exp
                acc[i] = times_pow2(acc[i], e)

    @cute.jit
    def _epilogue(self, acc, thr, mD, mBias, m, row0, tn):
        """Bias in FP32, round once, stores of rows < M and columns < N (64-row sub-tile).

        The accumulator gives a thread two adjacent columns per row and n8 block: stored as
        they lie, a warp's store touches eight rows at 4-byte steps, and a tile's epilogue
        cost as much as several of its K stages (docs/gemm_log.md, 'Numbers behind the
        kernel sources'). So the rounded pairs are transposed across each quad first
        (quad_transpose): a thread then holds 8 consecutive columns of a row and stores them
        as 16 bytes, which every output allows (gemm_sm90.host.gemm refuses one whose address or
        row stride is not 16-byte aligned). Where a row or its 8 columns pass M or N, they
        are stored one by one."""
        coords = thr.partition_C(cute.make_identity_tensor((64, self.tile_n)))
        size = cute.size(acc)
        # the m64 x tile_n accumulator's register order: (column pair, row half, n8 block)
        assert size == 64 * self.tile_n // WG_THREADS
        dtype = mD.element_type
        vals = cute.make_rmem_tensor((size,), dtype)
        for i0 in cutlass.range_constexpr(0, size, UNROLL_CHUNK):
            for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, size)):
                v = acc[i]
                if cutlass.const_expr(self.has_bias):
                    _r, c = coords[i]
                    col = cutlass.min(tn * self.tile_n + c, self.n - 1)  # past N: discarded
                    v = v + mBias[col].to(cutlass.Float32)
                vals[i] = v.to(dtype)
        words = cute.recast_tensor(vals, Int32)  # word 2 j + h: row half h of n8 block j
        base = mD.iterator.toint()
        t = cute.arch.lane_idx() % 4
        for h in cutlass.range_constexpr(2):
            r, _c = coords[2 * h]
            row = row0 + r
            for q in cutlass.range_constexpr(self.tile_n // 32):
                got = quad_transpose([words[2 * (4 * q + s) + h] for s in range(4)], t)
                eight = cute.make_rmem_tensor((4,), Int32)
                for s in cutlass.range_constexpr(4):
                    eight[s] = got[s]
                col0 = tn * self.tile_n + 32 * q + 8 * t
                if (row < m) & (col0 + 8 <= self.n):
                    addr = base + (cutlass.Int64(row) * self.ld_out + col0) * (dtype.width // 8)
                    cute.autovec_copy(
                        eight,
                        cute.make_tensor(
                            cute.make_ptr(Int32, addr, cute.AddressSpace.gmem, assumed_align=16),
                            cute.make_layout(4),
                        ),
                    )
                else:
                    halves = cute.recast_tensor(eight, dtype)
                    for e in cutlass.range_constexpr(8):
                        if row < m and col0 + e < self.n:
                            mD[row, col0 + e] = halves[e]
