"""Swap-AB MXFP8 GEMM for few tokens on sm_90a (imports cutlass: load lazily).

With few tokens the GEMM streams the weight: at 16 tokens (N 7168, K 43008) the 308 MB of
E4M3 weight bytes are the whole cost, and a 128-row tile of tokens would be mostly empty.
Here the roles swap: the weight is the wgmma M operand, converted by the consumer warps
straight from the TMA'd FP8 stage into BF16 *register* fragments (RS wgmma), and the tokens
are the wgmma N operand (8 to 64), converted to a small BF16 tile in shared memory.
out^T = W . A^T.

Work units are (64-row weight tile, K stage of 128) pairs (128-row with ``tile_w`` 128) in
tile-major order; CTA c of G takes units [c U / G, (c + 1) U / G) (stream-K), so every SM
streams the same number of weight bytes. G is the SM count, or with ``tile_aligned`` the
largest count up to it at which no range crosses a tile boundary partway
(config.aligned_groups): fewer SMs, but no CTA finishes one tile's tail and then another's
head. A CTA's range is cut into segments, one per weight tile it touches. A whole tile is
stored directly; a tile split across CTAs is finished by the CTA holding its tail: the lower
CTAs publish their head or middle parts to a global workspace and raise a flag (st.release),
the tail's CTA waits for them (ld.acquire) after its own range and adds the parts in K
order, so results do not depend on timing. A CTA waits only on lower CTAs, which never wait
on it and start no later. It awaits their flags together and loads their parts several at a
time before adding them in order: one part at a time, each an L2 round trip, had cost the
last CTA a visible wait (docs/gemm_log.md, 'Numbers behind the kernel sources').

Each CTA has 1 + C warpgroups:

* warpgroup 0, warp 0: TMA producer of the FP8 weight tile (64 x K 128), the token tile
  (tokens_tile x K 128) and their 512-byte blocked-scale chunks (``load_pipe``);
* warpgroups 1..C: consumers, warpgroup c on the segment's stages c - 1, c - 1 + C, ...
  (C interleaved K streams, so one warpgroup's conversion overlaps the others' loads and
  wgmmas), each with its own FP32 accumulator; at the end of a segment warpgroup 1 adds
  the others' partial sums in a fixed order. More consumers hide more of the conversion
  behind the TMA stream (docs/gemm_log.md, 'Numbers behind the kernel sources').

With ``bf16_tokens`` the tokens arrive already BF16, converted once by a launch before the
GEMM (gemm_sm90.device.tokens): the producer loads the stage's BF16 token tile (two K halves)
instead of the FP8 one and its scales, and a consumer keeps a stage until its wgmmas, which
read that tile, are done. Every CTA converting all the tokens had been a large part of a
consumer's conversion work at 32 tokens (docs/gemm_log.md, 'Numbers behind the kernel
sources').

With ``tile_w`` 128 (row split; ``bf16_tokens``, two consumers, up to 128 tokens) a stage
holds 128 weight rows: both consumers take every stage, each converts its 64 rows, and both
read the stage's one token tile, so the tokens cross L2 once per 128 weight rows instead of
per 64. Each consumer finishes its own rows (its own stream-K slot and flag; no reduction).
At 48-64 tokens that measured faster than the tiled kernel on the large weights
(docs/gemm_log.md, variant 39).

With ``cluster`` 2 (``bf16_tokens``) the CTAs run in pairs: the units are (pair of adjacent
weight tiles, K stage), a pair's two CTAs take its two tiles over the same stages, and each
loads one K half of the stage's token tile into both CTAs (TMA multicast), so every CTA's
stage still holds the whole tile while the tokens cross L2 half as often. A stage is free
once the consumers of both CTAs have released it (each consumer warp arrives on both CTAs'
barriers). A little faster at 16-64 tokens in the 64-row kernel, no gain with 128-row
stages: the tokens' L2 traffic is a small part of the cost (docs/gemm_log.md, variant 40).

K order inside each 32-element scale group is permuted, identically for both operands, so
that every thread loads its weight bytes with two 8-byte loads per group and row: thread
(g, t) of a warp holds bytes 8t..8t+7 of its rows, bytes 0-3 feeding the group's first
k16 wgmma and 4-7 the second. The token converter writes each BF16 pair to the K slot the
weight fragment put its partner in. The sum over K is unchanged; only its order differs
(the same summation-order freedom the tiled kernel has).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator

from ....format import CHUNK_BYTES, ROW_BLOCK
from ...runtime.launcher import address
from ..constants import CHUNK_WORDS, TILE_K8, TILE_K16, WG_THREADS
from ..device.common import (
    chunk_slots,
    chunk_views,
    convert_fragment,
    fp8_load_pipe,
    gemm_tensors,
    load_fragment_bytes,
    rs_tiled_mma,
    smem_layout,
    tma_load,
    tma_load_chunks,
    tma_views,
)
from ..workspace import PARTS_PER_SLOT
from .parts import (
    K_STEPS,
    L2_EVICT_FIRST,
    L2_EVICT_NORMAL,
    TILE_W,
    W_GROUPS,
    SwapABParts,
)


class MXFP8SwapABGemmSm90(SwapABParts):
    """``out[:M] = dequant(A) @ dequant(B).T (+ bias)`` for M <= ``cfg.tokens_tile``.

    The launch, the producer and the consumers' main loop are here; the geometry, the
    token tile's loads and the partial sums' reduction, fixup and store are in
    :class:`SwapABParts`."""

    @cute.jit
    def __call__(
        self,
        a: cute.Pointer, sa: cute.Pointer, b: cute.Pointer, sb: cute.Pointer,  # operands
        bias, out: cute.Pointer,
        m: cutlass.Int32, sa_chunks: cutlass.Int32,
        partials: cute.Pointer, flags: cute.Pointer,  # the stream-K workspace
        stream: cuda.CUstream,
    ):  # fmt: skip
        """Launch on ``stream``. ``a`` holds the BF16 tokens in a ``bf16_tokens`` build;
        ``bias`` is None in a build without bias; ``partials`` and ``flags`` are the stream-K
        workspace."""
        a_addr = address(a)
        addrs = (a_addr, *(address(p) for p in (sa, b, sb, bias, out)))
        mA, mSA, mW, mSW, mD, mBias = gemm_tensors(self, addrs, m, sa_chunks, self.w_chunks)
        if cutlass.const_expr(self.bf16_tokens):
            # the A address holds the BF16 tokens [m, K]
            mA = cute.make_tensor(
                cute.make_ptr(cutlass.BFloat16, a_addr, cute.AddressSpace.gmem, assumed_align=16),
                cute.make_layout((m, self.k), stride=(self.k, 1)),
            )
        self._launch(mA, mSA, mW, mSW, mD, mBias, m, partials, flags, stream)

    @cute.jit
    def _launch(self, tokens, mSA, mW, mSW, mD, mBias, m, partials, flags, stream):
        """Build the TMA atoms and shared storage, and launch. ``tokens`` is the FP8 tokens
        tensor, the BF16 one (``bf16_tokens``) or whatever the variant's token hooks read
        (W8A16: the tuple of the slices' BF16 tensors, an atom each; swap_ab.w8a16)."""
        fp8 = cutlass.Float8E4M3FN
        bf16 = cutlass.BFloat16
        tn = self.tn
        mPartials, mFlags = self._workspace(address(partials), address(flags))

        tiled_mma = rs_tiled_mma(bf16, (TILE_W, tn))
        sk = self.stage_k
        w8_layout = smem_layout(fp8, self.tile_w, sk, self.stages)
        s_layout = chunk_slots(self.stages)
        tma_w, gW = tma_load(mW, w8_layout, (self.tile_w, sk))
        tma_sw, gSW = tma_load_chunks(mSW, s_layout)
        if cutlass.const_expr(self.bf16_tokens):
            # the stage's K halves of 64 (one with stage_k 64)
            a8_layout = smem_layout(fp8, 8, TILE_K8, 1)  # unused
            a16_layout = smem_layout(bf16, tn, TILE_K16, self.stages * sk // TILE_K16)
            tma_a, gA = self._token_tma(tokens, a16_layout, tn)
            tma_sa, gSA = tma_sw, gSW  # unused
            self.tx_bytes = self.tile_w * sk + tn * sk * 2 + CHUNK_BYTES
        else:
            a8_layout = smem_layout(fp8, tn, TILE_K8, self.stages)
            # per consumer warpgroup: the stage's two K halves of BF16 tokens
            a16_layout = smem_layout(bf16, tn, TILE_K16, 2 * self.consumers)
            tma_a, gA = tma_load(tokens, a8_layout, (tn, TILE_K8))
            tma_sa, gSA = tma_load_chunks(mSA, s_layout)
            self.tx_bytes = (TILE_W + tn) * TILE_K8 + 2 * CHUNK_BYTES
        stages = self.stages
        sa_words = CHUNK_WORDS * (1 if self.bf16_tokens else stages)
        # consumers 2..'s partial sums for consumer 0 (none with the row split: each
        # consumer finishes its own rows)
        frag_size = TILE_W * tn // WG_THREADS
        red_words = 4 if self.row_split else (self.consumers - 1) * WG_THREADS * frag_size

        @cute.struct
        class Storage:
            load_bar: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sW8: cute.struct.Align[cute.struct.MemRange[fp8, cute.cosize(w8_layout)], 1024]
            sA8: cute.struct.Align[cute.struct.MemRange[fp8, cute.cosize(a8_layout)], 1024]
            sA16: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(a16_layout)], 1024]
            sSW: cute.struct.Align[cute.struct.MemRange[Int32, CHUNK_WORDS * stages], 128]
            sSA: cute.struct.Align[cute.struct.MemRange[Int32, sa_words], 128]
            sRed: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, red_words], 16]

        self.storage = Storage
        launch = self.kernel(
            tma_w, gW, tma_a, gA, tma_sw, gSW, tma_sa, gSA, mD, mBias, m, tiled_mma,
            w8_layout, a8_layout, a16_layout, s_layout, mPartials, mFlags,
        ).launch  # fmt: skip
        launch(
            grid=self._grid(m),
            block=[(1 + self.consumers) * WG_THREADS, 1, 1],
            cluster=(self.cluster, 1, 1),
            min_blocks_per_mp=1,
            stream=stream,
        )

    @cute.jit
    def _workspace(self, partials_addr, flags_addr):
        """The stream-K workspace tensors (gemm_sm90.workspace): per CTA ``ws_slots`` slots,
        each of its published head or middle part and its own tail part, and a flag each."""
        gmem = cute.AddressSpace.gmem
        partials_ptr = cute.make_ptr(cutlass.Float32, partials_addr, gmem, assumed_align=16)
        flags_ptr = cute.make_ptr(cutlass.Int32, flags_addr, gmem, assumed_align=16)
        slots = self.num_ctas * self.ws_slots
        mPartials = cute.make_tensor(
            partials_ptr, cute.make_layout((self.ws_frag, WG_THREADS, PARTS_PER_SLOT, slots))
        )
        mFlags = cute.make_tensor(flags_ptr, cute.make_layout((slots,)))
        return mPartials, mFlags

    @cute.kernel
    def kernel(
        self,
        tma_w: cute.CopyAtom,
        gW_full: cute.Tensor,
        tma_a,  # a CopyAtom, or one per slice (W8A16)
        gA_full,  # a Tensor, or one per slice
        tma_sw: cute.CopyAtom,
        gSW_full: cute.Tensor,
        tma_sa: cute.CopyAtom,
        gSA_full: cute.Tensor,
        mD: cute.Tensor,
        mBias: cute.Tensor,
        m: cutlass.Int32,
        tiled_mma: cute.TiledMma,
        w8_layout: cute.ComposedLayout,
        a8_layout: cute.ComposedLayout,
        a16_layout: cute.ComposedLayout,
        s_layout: cute.Layout,
        mPartials: cute.Tensor,
        mFlags: cute.Tensor,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        cta, _, _ = cute.arch.block_idx()
        # stream-K: CTA group q of G (a CTA, or a cluster) owns the (weight tile group, K
        # stage) units [q U / G, (q + 1) U / G)
        group, rank = self._group_rank(cta)
        begin = group * self.units // self.num_groups
        end = (group + 1) * self.units // self.num_groups
        a_atoms, sa_atoms = self._token_atoms(tma_a, tma_sa)
        if warp == 0:
            for atom in (tma_w, *a_atoms, tma_sw, *sa_atoms):
                cpasync.prefetch_descriptor(atom)
        st = SmemAllocator().allocate(self.storage)
        load_pipe = fp8_load_pipe(
            st.load_bar.data_ptr(), self.stages, WG_THREADS * self.stage_consumers, self.tx_bytes,
            self.cluster,
        )  # fmt: skip
        cute.arch.mbarrier_init_fence()
        if cutlass.const_expr(self.cluster > 1):
            # the peer's multicasts and releases reach these barriers: all initialized first
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()
        roles = (cta, begin, end, rank, m, st, load_pipe)
        if cutlass.const_expr(self.registers is None):
            # written out here rather than through the roles' methods below, which give
            # the same program in another PTX order (the W8A8 builds' PTX is pinned)
            if warp == 0:
                sW8 = st.sW8.get_tensor(w8_layout.outer, swizzle=w8_layout.inner)
                if cutlass.const_expr(self.bf16_tokens):
                    sA8 = st.sA16.get_tensor(a16_layout.outer, swizzle=a16_layout.inner)
                else:
                    sA8 = st.sA8.get_tensor(a8_layout.outer, swizzle=a8_layout.inner)
                sSW = st.sSW.get_tensor(s_layout)
                sSA = st.sSA.get_tensor(s_layout)
                self._producer(
                    cta, begin, end, rank, tma_w, gW_full, tma_a, gA_full, tma_sw, gSW_full,
                    tma_sa, gSA_full, sW8, sA8, sSW, sSA, load_pipe,
                )  # fmt: skip
            elif wg >= 1:
                sA16 = st.sA16.get_tensor(a16_layout.outer, swizzle=a16_layout.inner)
                self._consumer(wg - 1, tidx % WG_THREADS, cta, begin, end, st, tiled_mma, sA16,
                               mD, mBias, m, mPartials, mFlags, load_pipe)  # fmt: skip
        elif wg == 0:
            # the producer warpgroup gives registers to the consumers' accumulators; each
            # role's code is apart (swap_ab.parts), so that ptxas holds each to its count
            cute.arch.setmaxregister_decrease(self.registers[0])
            if warp == 0:
                self._run_producer(roles, tma_w, gW_full, tma_a, gA_full, tma_sw, gSW_full,
                                   tma_sa, gSA_full, w8_layout, a8_layout, a16_layout, s_layout)  # fmt: skip
        else:
            cute.arch.setmaxregister_increase(self.registers[1])
            self._run_consumer(roles, wg - 1, tidx % WG_THREADS, tiled_mma, a16_layout, mD,
                               mBias, mPartials, mFlags)  # fmt: skip

    @cute.jit
    def _producer(
        self, cta, begin, end, rank, tma_w, gW_full, tma_a, gA_full, tma_sw, gSW_full,
        tma_sa, gSA_full, sW8, sA8, sSW, sSA, load_pipe,
    ):  # fmt: skip
        tWs, tWg = tma_views(tma_w, sW8, gW_full, (self.tile_w, TILE_K8))
        token_views = self._token_views(tma_a, sA8, gA_full)
        tSWs, tSWg = chunk_views(tma_sw, sSW, gSW_full)
        tSAs, tSAg = chunk_views(tma_sa, sSA, gSA_full)
        ps = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        evict_first = cutlass.Int64(L2_EVICT_FIRST)
        for u in range(begin, end):
            group_tile = u // self.k_tiles
            kt = u - group_tile * self.k_tiles
            tile = self._w_tile(group_tile, rank)
            w_chunk0 = ((tile * self.tile_w) // ROW_BLOCK) * self.k_tiles
            load_pipe.producer_acquire(ps)
            bar = load_pipe.producer_get_barrier(ps)
            # the weight and its scales are read once: evict them first, so they do not push
            # the tokens (read by every CTA) out of L2
            cute.copy(
                tma_w, tWg[(None, tile, kt)], tWs[(None, ps.index)], tma_bar_ptr=bar,
                cache_policy=evict_first,
            )  # fmt: skip
            self._load_token_stage(tma_a, token_views, ps, kt, rank, bar, 0)
            cute.copy(
                tma_sw, tSWg[(None, 0, w_chunk0 + kt)], tSWs[(None, ps.index)], tma_bar_ptr=bar,
                cache_policy=evict_first,
            )  # fmt: skip
            if cutlass.const_expr(not self.bf16_tokens):
                # tokens <= 128: every stage's token scales are chunk kt of row block 0
                cute.copy(tma_sa, tSAg[(None, 0, kt)], tSAs[(None, ps.index)], tma_bar_ptr=bar)
            load_pipe.producer_commit(ps)
            ps.advance()
        load_pipe.producer_tail(ps)

    @cute.jit
    def _consumer(
        self, cw, ct, cta, begin, end, st, tiled_mma, sA16, mD, mBias, m, mPartials, mFlags,
        load_pipe,
    ):  # fmt: skip
        """Segment by segment (the units of one weight tile): C interleaved K streams, their
        partial sums added in a fixed order, then stored, published or kept for the fixup.

        With ``bf16_tokens`` the stage's token tile is already BF16 (TMA'd): no token
        conversion, and a stage is released only once its wgmmas, which read that tile,
        have completed (at this consumer's next stage, or the segment's end)."""
        thr = tiled_mma.get_slice(ct)
        frag = tiled_mma.make_fragment_A(thr.partition_shape_A((TILE_W, TILE_K8)))
        # Int32 view: word rr + 2 * hi + 4 * kb = BF16 pair (row g + 8 rr, k 2t + 8 hi) of
        # k16 block kb, the register order of the RS wgmma's A fragment
        frag_words = cute.recast_tensor(frag, Int32)
        tCrB = tiled_mma.make_fragment_B(thr.partition_B(sA16))
        acc = cute.make_rmem_tensor(thr.partition_shape_C((TILE_W, self.tn)), cutlass.Float32)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)

        w8 = st.sW8.data_ptr().toint()
        a8 = st.sA8.data_ptr().toint()
        sw = st.sSW.data_ptr().toint()
        sa = st.sSA.data_ptr().toint()
        a16 = st.sA16.data_ptr().toint() + cw * (2 * self.tn * TILE_K16 * 2)
        lane = ct % 32
        # weight rows row0, row0 + 8 of the stage (of this consumer's 64 with the row split)
        row0 = (ct // 32) * 16 + lane // 4 + (cw * TILE_W if self.row_split else 0)
        t = lane % 4
        kts = self.k_tiles
        consumers = self.consumers
        # stages a consumer steps over: every C-th one, or (row split) every one
        stride = 1 if self.row_split else consumers
        stages = self.stages
        _group, rank = self._group_rank(cta)
        smem = (w8, sw, a8, sa, a16)
        mma = (tiled_mma, frag, frag_words, tCrB, acc)
        u = begin
        owned = Int32(-1)  # the tile group whose tail this CTA holds for the final fixup
        while u < end:
            tile = u // kts  # the tile group (the weight tile without clusters)
            tile_end = (tile + 1) * kts
            seg_end = cutlass.min(end, tile_end)
            # consumer cw takes the segment's stages first, first + C, ... (C <= stages);
            # with the row split every consumer takes every stage
            first = 0 if self.row_split else self._first_stage(cw, u - begin)
            g = u - begin + first
            ls = pipeline.PipelineState(stages, g, g % stages, (g // stages) % 2)
            if cutlass.const_expr(self.bf16_tokens):
                rel = pipeline.PipelineState(stages, g, g % stages, (g // stages) % 2)
            else:
                rel = None  # each stage is released once its tokens are converted
            acc.fill(0.0)
            if cutlass.const_expr(self.row_split):
                count = seg_end - u
            else:
                count = (seg_end - u - first + consumers - 1) // consumers
            ls, rel = self._segment_stages(
                cw, ct, row0, t, stride, count, tile, rank, smem, mma, load_pipe, ls, rel
            )  # fmt: skip
            warpgroup.wait_group(0)
            if cutlass.const_expr(self.bf16_tokens):
                if rel.count < ls.count:
                    load_pipe.consumer_release(rel)
            if cutlass.const_expr(self.row_split):
                # every consumer finishes its own rows
                owned = self._finish_segment(u, seg_end, tile, tile_end, thr, acc, mD, mBias,
                                             m, ct, cw, cta, mPartials, mFlags, owned, rank)  # fmt: skip
            else:
                self._reduce_consumers(cw, ct, st, acc)
                if cw == 0:
                    owned = self._finish_segment(u, seg_end, tile, tile_end, thr, acc, mD,
                                                 mBias, m, ct, cw, cta, mPartials, mFlags,
                                                 owned, rank)  # fmt: skip
            u = seg_end
        if cutlass.const_expr(self.row_split):
            if owned >= 0:
                self._fixup(ct, cw, cta, owned, thr, acc, mD, mBias, m, mPartials, mFlags)
        elif cw == 0 and owned >= 0:
            self._fixup(ct, cw, cta, owned, thr, acc, mD, mBias, m, mPartials, mFlags)

    @cute.jit
    def _segment_stages(
        self, cw, ct, row0, t, stride, count, tile, rank, smem, mma, load_pipe, ls, rel
    ):  # fmt: skip
        """A segment's ``count`` stages of this consumer: per stage, its weight rows converted
        into the A fragment and its tokens into the B tile (unless ``bf16_tokens``), then the
        stage's wgmmas. Leaves the last wgmmas in flight and, with ``bf16_tokens``, the
        stages from ``rel`` on unreleased. Returns the advanced ``ls`` and ``rel``."""
        w8, sw, a8, sa, a16 = smem
        tiled_mma, frag, frag_words, tCrB, acc = mma
        selector = self._fragment_selector(t)
        for _i in range(count):
            load_pipe.consumer_wait(ls)
            w_words, w_scales = self._load_weight_fragment(
                w8 + ls.index * (self.tile_w * TILE_K8), row0, t,
                sw + ls.index * CHUNK_BYTES,
                (self._w_tile(tile, rank) * self.tile_w) % ROW_BLOCK,
            )  # fmt: skip
            if cutlass.const_expr(not self.bf16_tokens):
                a_units = self._load_tokens(ct, a8, sa, ls.index)
            # the previous stage's wgmma has read the fragment registers and token tile
            warpgroup.wait_group(0)
            if cutlass.const_expr(self.bf16_tokens):
                if rel.count < ls.count:  # this consumer's previous stage
                    load_pipe.consumer_release(rel)
                    for _a in cutlass.range_constexpr(stride):
                        rel.advance()
            else:
                self._store_tokens(a_units, a16)
                # generic-proxy stores -> visible to wgmma (async proxy) after the barrier
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier(barrier_id=1 + cw, number_of_threads=WG_THREADS)
            self._convert_weight_fragment(w_words, w_scales, selector, frag_words)
            if cutlass.const_expr(not self.bf16_tokens):
                load_pipe.consumer_release(ls)
            # the token tile: this stage's own (bf16_tokens), else this consumer's
            tokens = 2 * ls.index if self.bf16_tokens else 2 * cw
            warpgroup.fence()
            for kb in cutlass.range_constexpr(K_STEPS):
                cute.gemm(
                    tiled_mma,
                    acc,
                    frag[(None, None, kb)],
                    tCrB[(None, None, kb % 4, tokens + kb // 4)],
                    acc,
                )
            warpgroup.commit_group()
            for _a in cutlass.range_constexpr(stride):
                ls.advance()
        return ls, rel

    # --- what a variant overrides (the W8A16 one: swap_ab/w8a16.py's SlicesTokens) --------

    def _token_tma(self, tokens, a16_layout, tn: int):
        """``bf16_tokens``: the TMA atom and global view of the BF16 token tile."""
        return tma_load(tokens, a16_layout, (tn, TILE_K16), multicast=self.cluster > 1)

    def _token_atoms(self, tma_a, tma_sa):
        """The tokens' TMA atoms to prefetch: those before the weight scales' atom, and after."""
        return (tma_a,), (tma_sa,)

    def _token_views(self, tma_a, sA8, gA_full):
        """The producer's shared and global views of the token tile."""
        a_tile = (self.tn, TILE_K16) if self.bf16_tokens else (self.tn, TILE_K8)
        return tma_views(tma_a, sA8, gA_full, a_tile)

    @cute.jit
    def _load_token_stage(self, tma_a, views, ps, kt, rank, bar, token_tile):
        """The producer's TMA of stage ``kt``'s token tile into stage ``ps.index`` (token tile
        ``token_tile``: 0 but in a ``token_tiles`` build, which only W8A16 has)."""
        tAs, tAg = views
        if cutlass.const_expr(self.cluster > 1):
            # K half ``rank`` of the token tile, into this stage of both CTAs (the full
            # barrier of each counts both halves)
            cute.copy(
                tma_a, tAg[(None, 0, 2 * kt + rank)], tAs[(None, 2 * ps.index + rank)],
                tma_bar_ptr=bar, mcast_mask=cutlass.Int16((1 << self.cluster) - 1),
                cache_policy=cutlass.Int64(L2_EVICT_NORMAL),
            )  # fmt: skip
        elif cutlass.const_expr(self.bf16_tokens):
            for h in cutlass.range_constexpr(2):
                cute.copy(
                    tma_a, tAg[(None, 0, 2 * kt + h)], tAs[(None, 2 * ps.index + h)],
                    tma_bar_ptr=bar,
                )  # fmt: skip
        else:
            cute.copy(tma_a, tAg[(None, 0, kt)], tAs[(None, ps.index)], tma_bar_ptr=bar)

    def _fragment_selector(self, t):
        """What the weight conversion needs besides the stage (nothing in natural order)."""
        return None

    def _load_weight_fragment(self, stage, row0, t, scales, scale_row0):
        """This thread's weight bytes and scales of a stage, in the permuted K order of the
        converted token tile (gemm_sm90.device.common)."""
        return load_fragment_bytes(stage, row0, t, W_GROUPS, scales, scale_row0)

    def _convert_weight_fragment(self, w_words, w_scales, selector, frag_words):
        """The weight bytes into the A fragment's BF16 words."""
        convert_fragment(w_words, w_scales, W_GROUPS, frag_words)
