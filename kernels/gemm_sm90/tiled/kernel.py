"""The tiled MXFP8 GEMM for sm_90a, A in registers (imports cutlass: load lazily).

Both operands are converted from E4M3 to 16-bit and multiplied by 16-bit wgmma with FP32
accumulation. Per output tile one of two paths, both exact up to summation order:

* FP16 (gemm_sm90.device.f16): each value times 2**(s - ref[row]), two instructions per pair; the
  epilogue multiplies by 2**(ref_a - 127) * 2**(ref_b - 127). Taken when every row of the
  tile's A and B has its scale bytes within 21 of each other (gemm_sm90.device.refs scans them in
  a launch before the GEMM);
* BF16 otherwise: each value times 2**(s - 127), four instructions per pair.

The token operand A never passes through shared memory as 16-bit: each consumer warpgroup
converts its own 64 rows from the TMA'd FP8 stage straight into the register fragments of
an RS wgmma. Only the weight operand B is converted into a 16-bit shared-memory tile, by
dedicated converter warps.

One CTA computes a tile_m x tile_n output tile (tile_m 128: two consumer warpgroups, tile_m
192: three), persistent over output tiles, the full row tiles first and a partial one last.
With ``stream_k`` the (output tile, K stage) units are instead split evenly over the CTAs
(as in gemm_sm90.swap_ab): a CTA's range is cut into segments, one per tile it touches; a tile
split across CTAs is finished by the CTA holding its tail, which adds the parts published by
the lower CTAs in K order (no atomics: every call sums alike). With few output tiles (fewer
than two waves) the persistent grid leaves SMs idle or runs an uneven last round; stream-K
keeps all of them streaming. ``stream_k`` 2 runs the full waves as whole tiles and splits
only the rest's units that way, which keeps the whole tiles' L2 sharing and evens out the
last round. The tile geometry and this work split are in gemm_sm90.tiled.schedule. Roles:

* warpgroup 0, warp 0: TMA producer of the FP8 A/B tiles (K 128) and their 512-byte
  blocked-scale chunks (``load_pipe``, released by converters and consumers); warp 1:
  each tile's row references and path into a two-stage ring (``ref_pipe``);
* warpgroup 1 (and 2 with ``converters`` 2): B converter, FP8 stage -> two 16-bit stages of
  K 64 (``conv_pipe``; the role's methods are in gemm_sm90.tiled.convert);
* the last two or three warpgroups: consumers, 64 A rows each: per K 64, convert A into the
  fragment, then four m64 x tile_n x k16 wgmmas against the 16-bit B stage (the role's
  methods, stream-K's fixup and the epilogue are in gemm_sm90.tiled.consumer). A consumer's
  conversion does not overlap its own wgmmas (they read the fragment), only the other
  consumers', so a third consumer keeps the tensor pipe busier (docs/gemm_log.md).

K order inside each 32-element scale group is permuted identically for A (thread (g, t)
holds bytes 8t..8t+7 of a group: 0-3 feed its first k16 block, 4-7 the second) and for the
B tile, as in gemm_sm90.swap_ab.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import SmemAllocator

from ....format import CHUNK_BYTES, ROW_BLOCK, SCALE_BIAS
from ...runtime.launcher import address
from ..constants import CHUNK_WORDS, TILE_K8, TILE_K16, WG_THREADS
from ..device.common import (
    chunk_slots,
    chunk_views,
    fp8_load_pipe,
    gemm_tensors,
    load_gmem_word,
    rs_tiled_mma,
    smem_layout,
    store_smem_word,
    tma_load,
    tma_load_chunks,
    tma_views,
)
from ..workspace import PARTS_PER_SLOT
from .consumer import ConsumerRole
from .convert import WeightConverterRole
from .schedule import CONVERT_WG0, REF_STAGES, REGS, SCAN_THREADS


class MXFP8TiledGemmSm90(WeightConverterRole, ConsumerRole):
    """Warp-specialized persistent MXFP8 GEMM: A FP8 -> BF16 registers, B FP8 -> BF16 tile.

    The launch, the producer warp and the reference warp are here; the converter and
    consumer warpgroups' methods are in their roles, and the tile geometry and work split
    all of them read in :class:`TiledSchedule`."""

    @cute.jit
    def __call__(
        self,
        a: cute.Pointer, sa: cute.Pointer, b: cute.Pointer, sb: cute.Pointer,  # operands
        bias, out: cute.Pointer,
        m: cutlass.Int32, sa_chunks: cutlass.Int32,
        refs_a: cute.Pointer, refs_b: cute.Pointer,  # per-row FP16 references
        partials, flags,  # the stream-K workspace
        stream: cuda.CUstream,
    ):  # fmt: skip
        """Launch on ``stream``. ``bias`` is None in a build without bias; ``partials`` and
        ``flags`` (the stream-K workspace) are None in a build without stream-K. ``refs_a`` and
        ``refs_b`` hold the per-row FP16 references of A and B (gemm_sm90.device.refs)."""
        addrs = tuple(address(p) for p in (a, sa, b, sb, bias, out))
        mA, mSA, mB, mSB, mD, mBias = gemm_tensors(self, addrs, m, sa_chunks, self.b_chunks)
        self._launch(mA, mSA, mB, mSB, mD, mBias, m, refs_a, refs_b, partials, flags, stream)

    @cute.jit
    def _launch(self, tokens, mSA, mB, mSB, mD, mBias, m, refs_a, refs_b, partials, flags, stream):
        """Build the TMA atoms and shared storage, and launch. ``tokens`` is the FP8 tokens
        tensor or whatever the variant's A hooks read (W8A16: the tuple of the slices' BF16
        tensors, an atom each, into BF16 stages with no A scales; tiled.w8a16)."""
        fp8 = cutlass.Float8E4M3FN
        bf16 = cutlass.BFloat16
        refs_a, refs_b = address(refs_a), address(refs_b)

        mmas = [rs_tiled_mma(dtype, (64, self.tile_n)) for dtype in (bf16, cutlass.Float16)]
        b8_layout = smem_layout(fp8, self.tile_n, TILE_K8, self.stages8)
        b16_layout = smem_layout(bf16, self.tile_n, TILE_K16, self.stages16)
        # one 512-byte scale chunk per operand per stage: tile N <= 128 rows lie in one chunk
        s_layout = chunk_slots(self.stages8)
        a_type, a_layout, tma_a, gA, sa_slots, sa_layout, tma_sa, gSA, a_bytes, scale_bytes = (
            self._a_operand(tokens, mSA)
        )
        tma_b, gB = tma_load(mB, b8_layout, (self.tile_n, TILE_K8))
        tma_sb, gSB = tma_load_chunks(mSB, s_layout)
        self.tx_bytes = a_bytes + self.tile_n * TILE_K8 + scale_bytes

        # persistent: one CTA per tile up to the cap; stream-K: one per unit up to the cap
        work = self._tiles(m)
        if cutlass.const_expr(self.stream_k):
            work = work * self.k_tiles
        grid = [cutlass.min(work, self.num_ctas_cap), 1, 1]
        mPartials, mFlags = self._workspace(address(partials), address(flags))
        stages8 = self.stages8
        stages16 = self.stages16
        ref_words = self.ref_words

        @cute.struct
        class Storage:
            load_bar: cute.struct.MemRange[cutlass.Int64, stages8 * 2]
            conv_bar: cute.struct.MemRange[cutlass.Int64, stages16 * 2]
            ref_bar: cute.struct.MemRange[cutlass.Int64, REF_STAGES * 2]
            refs: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, ref_words * REF_STAGES], 16]
            sA: cute.struct.Align[cute.struct.MemRange[a_type, cute.cosize(a_layout)], 1024]
            sB8: cute.struct.Align[cute.struct.MemRange[fp8, cute.cosize(b8_layout)], 1024]
            sB16: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(b16_layout)], 1024]
            sSA: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, CHUNK_WORDS * sa_slots], 128]
            sSB: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, CHUNK_WORDS * stages8], 128]

        self.storage = Storage
        launch = self.kernel(
            tma_a, gA, tma_b, gB, tma_sa, gSA, tma_sb, gSB, refs_a, refs_b, mD, mBias, m,
            mmas[0], mmas[1], a_layout, b8_layout, b16_layout, s_layout, sa_layout, mPartials,
            mFlags,
        ).launch  # fmt: skip
        launch(
            grid=grid,
            block=[WG_THREADS * (self.consumer_wg0 + self.consumers), 1, 1],
            cluster=(1, 1, 1),
            min_blocks_per_mp=1,
            stream=stream,
        )

    @cute.jit
    def _workspace(self, partials_addr, flags_addr):
        """The stream-K workspace tensors (gemm_sm90.workspace): per CTA ``ws_blocks`` slots,
        each of a published head or middle part and a tail part, and a flag each (unread by a
        build without stream-K)."""
        gmem = cute.AddressSpace.gmem
        cap, cons, frag = self.num_ctas_cap, self.ws_blocks, self.frag
        parts = PARTS_PER_SLOT
        mPartials = cute.make_tensor(
            cute.make_ptr(cutlass.Float32, partials_addr, gmem, assumed_align=16),
            cute.make_layout(
                (frag, WG_THREADS, parts, cons, cap),
                stride=(WG_THREADS, 1, frag * WG_THREADS, parts * frag * WG_THREADS,
                        cons * parts * frag * WG_THREADS),
            ),
        )  # fmt: skip
        mFlags = cute.make_tensor(
            cute.make_ptr(cutlass.Int32, flags_addr, gmem, assumed_align=16),
            cute.make_layout((cons, cap)),
        )
        return mPartials, mFlags

    @cute.kernel
    def kernel(
        self,
        tma_a,  # a CopyAtom, or one per slice (W8A16)
        gA_full,  # a Tensor, or one per slice
        tma_b: cute.CopyAtom,
        gB_full: cute.Tensor,
        tma_sa,  # a CopyAtom (None in a W8A16 build: no A scales)
        gSA_full,
        tma_sb: cute.CopyAtom,
        gSB_full: cute.Tensor,
        refs_a: cutlass.Int64,
        refs_b: cutlass.Int64,
        mD: cute.Tensor,
        mBias: cute.Tensor,
        m: cutlass.Int32,
        mma_bf16: cute.TiledMma,
        mma_f16: cute.TiledMma,
        a_layout: cute.ComposedLayout,
        b8_layout: cute.ComposedLayout,
        b16_layout: cute.ComposedLayout,
        s_layout: cute.Layout,
        sa_layout: cute.Layout,
        mPartials: cute.Tensor,
        mFlags: cute.Tensor,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        a_atoms, sa_atoms = self._a_atoms(tma_a, tma_sa)
        if warp == 0:
            for atom in (*a_atoms, tma_b, *sa_atoms, tma_sb):
                cpasync.prefetch_descriptor(atom)
        st = SmemAllocator().allocate(self.storage)
        # the B converters and the A-converting consumers both read each FP8 stage
        readers = self.convert_threads + self.consumers * WG_THREADS
        load_pipe = fp8_load_pipe(st.load_bar.data_ptr(), self.stages8, readers, self.tx_bytes)
        conv_pipe = pipeline.PipelineAsync.create(
            barrier_storage=st.conv_bar.data_ptr(),
            num_stages=self.stages16,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.convert_threads),
            # k-split: each 16-bit stage (one K half) is read by one consumer warpgroup
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.row_blocks * WG_THREADS
            ),
            defer_sync=True,
        )
        ref_pipe = pipeline.PipelineAsync.create(
            barrier_storage=st.ref_bar.data_ptr(),
            num_stages=REF_STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, SCAN_THREADS),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.convert_threads + self.consumers * WG_THREADS
            ),
            defer_sync=True,
        )
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        producer_regs, converter_regs, consumer_regs = REGS[
            (self.convert_wgs, self.consumers, self.stream_k)
        ]
        if wg == 0:
            cute.arch.setmaxregister_decrease(producer_regs)  # one warp issues TMA
            if warp == 0:
                sA = st.sA.get_tensor(a_layout.outer, swizzle=a_layout.inner)
                sB8 = st.sB8.get_tensor(b8_layout.outer, swizzle=b8_layout.inner)
                sSA = st.sSA.get_tensor(sa_layout)
                sSB = st.sSB.get_tensor(s_layout)
                self._producer(
                    tma_a, gA_full, tma_b, gB_full, tma_sa, gSA_full, tma_sb, gSB_full,
                    sA, sB8, sSA, sSB, load_pipe, m,
                )  # fmt: skip
            elif warp == 1:
                self._tile_refs(tidx % 32, refs_a, refs_b, m, st, ref_pipe)
        elif wg < self.consumer_wg0:
            cute.arch.setmaxregister_decrease(converter_regs)
            ct = tidx - CONVERT_WG0 * WG_THREADS
            self._converter(ct, m, st, load_pipe, conv_pipe, ref_pipe)
        else:
            cute.arch.setmaxregister_increase(consumer_regs)
            sB16 = st.sB16.get_tensor(b16_layout.outer, swizzle=b16_layout.inner)
            sB16h = st.sB16.get_tensor(
                b16_layout.outer, swizzle=b16_layout.inner, dtype=cutlass.Float16
            )
            self._consumer(
                wg - self.consumer_wg0, tidx % WG_THREADS, (mma_bf16, mma_f16), st, (sB16, sB16h),
                mD, mBias, m, load_pipe, conv_pipe, ref_pipe, mPartials, mFlags,
            )  # fmt: skip

    @cute.jit
    def _producer(
        self, tma_a, gA_full, tma_b, gB_full, tma_sa, gSA_full, tma_sb, gSB_full,
        sA, sB8, sSA, sSB, load_pipe, m,
    ):  # fmt: skip
        a_views = self._a_views(tma_a, sA, gA_full)
        tBsB, tBgB = tma_views(tma_b, sB8, gB_full, (self.tile_n, TILE_K8))
        tSAs, tSAg = self._a_scale_views(tma_sa, sSA, gSA_full)
        tSBs, tSBg = chunk_views(tma_sb, sSB, gSB_full)
        k_tiles = self.k_tiles
        u, stop, hop = self._my_units(m)
        ps = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages8)
        while u < stop:
            _t, tm, tn, k0, k1, seg_end = self._segment(u, stop, m)
            b_chunk0 = ((tn * self.tile_n) // ROW_BLOCK) * k_tiles
            a_chunk0 = ((tm * self.tile_m) // ROW_BLOCK) * k_tiles
            for kt in range(k0, k1):
                load_pipe.producer_acquire(ps)
                bar = load_pipe.producer_get_barrier(ps)
                self._load_a_stage(tma_a, a_views, ps, tm, kt, bar)
                cute.copy(tma_b, tBgB[(None, tn, kt)], tBsB[(None, ps.index)], tma_bar_ptr=bar)
                for c in cutlass.range_constexpr(self.staged_a_chunks):
                    # past the last chunk (the tile's rows past M) TMA fills zeros
                    cute.copy(
                        tma_sa,
                        tSAg[(None, 0, a_chunk0 + c * k_tiles + kt)],
                        tSAs[(None, ps.index * self.a_chunks + c)],
                        tma_bar_ptr=bar,
                    )
                cute.copy(
                    tma_sb, tSBg[(None, 0, b_chunk0 + kt)], tSBs[(None, ps.index)], tma_bar_ptr=bar
                )
                load_pipe.producer_commit(ps)
                ps.advance()
            u = self._next_unit(seg_end, hop)
        load_pipe.producer_tail(ps)

    @cute.jit
    def _tile_refs(self, lane, refs_a, refs_b, m, st, ref_pipe):
        """Warp 1: per tile, the reference bytes of its A rows and B rows (gemm_sm90.device.refs)
        into the ring as ``ref - 127``, and the tile's path: BF16 if any valid row is -1."""
        refs = st.refs.data_ptr().toint()
        u, stop, hop = self._my_units(m)
        ps = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, REF_STAGES)
        b_parts = self.tile_n // 32
        while u < stop:
            _t, tm, tn, _k0, _k1, seg_end = self._segment(u, stop, m)
            a_rows = [tm * self.tile_m + lane + 32 * i for i in range(self.tile_m // 32)]
            b_rows = [tn * self.tile_n + lane + 32 * i for i in range(b_parts)]
            # the scan wrote padded_rows(M) words; a 192-row tile may reach past them
            a_refs = [load_gmem_word(refs_a + cutlass.min(r, m - 1) * 4) for r in a_rows]
            b_refs = [load_gmem_word(refs_b + r * 4) for r in b_rows]
            misfit = Int32(0)
            for r, v in zip(a_rows, a_refs, strict=True):
                misfit = misfit | cutlass.select_((r < m) & (v < 0), Int32(1), Int32(0))
            for r, v in zip(b_rows, b_refs, strict=True):
                misfit = misfit | cutlass.select_((r < self.n) & (v < 0), Int32(1), Int32(0))
            mode = cute.arch.vote_any_sync(misfit != 0)
            ref_pipe.producer_acquire(ps)
            buf = refs + ps.index * (self.ref_words * 4)
            for i in cutlass.range_constexpr(self.tile_m // 32):
                store_smem_word(buf + (lane + 32 * i) * 4, a_refs[i] - SCALE_BIAS)
            for i in cutlass.range_constexpr(b_parts):
                store_smem_word(buf + (self.b_ref0 + lane + 32 * i) * 4, b_refs[i] - SCALE_BIAS)
            if lane == 0:
                store_smem_word(buf + self.mode_word * 4, cutlass.select_(mode, Int32(1), Int32(0)))
            ref_pipe.producer_commit(ps)
            ps.advance()
            u = self._next_unit(seg_end, hop)
        ref_pipe.producer_tail(ps)

    # --- what a variant overrides (the W8A16 one: tiled/w8a16.py's SlicesA) ---------------

    def _a_operand(self, tokens, mSA):
        """A's shared-memory type and stage layout, its TMA atom and global view, the A
        scale slots, their layout, atom and view, and the bytes one stage's A and scales
        bring (FP8 A with its scale chunks)."""
        a_type = fp8 = cutlass.Float8E4M3FN
        a_layout = smem_layout(fp8, self.tile_m, TILE_K8, self.stages8)
        sa_slots = self.stages8 * self.a_chunks
        sa_layout = chunk_slots(sa_slots)
        tma_a, gA = tma_load(tokens, a_layout, (self.tile_m, TILE_K8))
        tma_sa, gSA = tma_load_chunks(mSA, sa_layout)
        a_bytes = self.tile_m * TILE_K8
        scale_bytes = (self.a_chunks + 1) * CHUNK_BYTES
        return a_type, a_layout, tma_a, gA, sa_slots, sa_layout, tma_sa, gSA, a_bytes, scale_bytes

    def _a_atoms(self, tma_a, tma_sa):
        """A's TMA atoms to prefetch: those before B's atom, and those after it."""
        return (tma_a,), (tma_sa,)

    def _a_views(self, tma_a, sA, gA_full):
        """The producer's shared and global views of A's stage."""
        return tma_views(tma_a, sA, gA_full, (self.tile_m, TILE_K8))

    def _a_scale_views(self, tma_sa, sSA, gSA_full):
        """The producer's shared and global views of A's scale chunks."""
        return chunk_views(tma_sa, sSA, gSA_full)

    @cute.jit
    def _load_a_stage(self, tma_a, views, ps, tm, kt, bar):
        """The producer's TMA of row tile ``tm``'s stage ``kt`` of A into stage ``ps.index``."""
        tAsA, tAgA = views
        cute.copy(tma_a, tAgA[(None, tm, kt)], tAsA[(None, ps.index)], tma_bar_ptr=bar)

    @property
    def staged_a_chunks(self) -> int:
        """A scale chunks the producer loads per stage."""
        return self.a_chunks
