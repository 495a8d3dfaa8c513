"""The CuTe DSL kernel behind :mod:`gemm_sm90` (imports cutlass: load it lazily)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup

TILE_M = 128
TILE_K = 128
GROUPS_PER_TILE = 4
CHUNK_WORDS = 128
WG_THREADS = 128
NUM_CONSUMER_WG = 2
CONVERT_WARP0 = 2  # warps 2 and 3 of the producer warpgroup decode the scales
CONVERT_THREADS = 64
TURN_BAR_WG0 = 1  # named barriers of the "pingpong" promotion turns (0 is __syncthreads)
TURN_BAR_WG1 = 2


class MXFP8GemmSm90:
    """Warp-specialized persistent MXFP8 GEMM with per-32-K FP32 promotion."""

    def __init__(self, cfg, n: int, k: int, ld_out: int, has_bias: bool, out_dtype):
        self.cfg = cfg
        self.out_dtype = out_dtype
        self.n = n
        self.k = k
        self.ld_out = ld_out
        self.has_bias = has_bias
        self.tile_n = cfg.tile_n
        self.stages = cfg.stages
        self.k_tiles = (k + TILE_K - 1) // TILE_K
        self.n_tiles = (n + self.tile_n - 1) // self.tile_n
        self.b_chunks = ((n + 127) // 128) * self.k_tiles

    @cute.jit
    def __call__(
        self,
        a_ptr: cute.Pointer,
        sa_ptr: cute.Pointer,
        b_ptr: cute.Pointer,
        sb_ptr: cute.Pointer,
        bias_ptr: cute.Pointer,
        out_ptr: cute.Pointer,
        m: cutlass.Int32,
        sa_chunks: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        fp8 = cutlass.Float8E4M3FN
        mA = cute.make_tensor(a_ptr, cute.make_layout((m, self.k), stride=(self.k, 1)))
        mB = cute.make_tensor(b_ptr, cute.make_layout((self.n, self.k), stride=(self.k, 1)))
        mSA = cute.make_tensor(
            sa_ptr, cute.make_layout((CHUNK_WORDS, sa_chunks), stride=(1, CHUNK_WORDS))
        )
        mSB = cute.make_tensor(
            sb_ptr, cute.make_layout((CHUNK_WORDS, self.b_chunks), stride=(1, CHUNK_WORDS))
        )
        mD = cute.make_tensor(out_ptr, cute.make_layout((m, self.n), stride=(self.ld_out, 1)))
        mBias = cute.make_tensor(bias_ptr, cute.make_layout((self.n,)))

        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            fp8,
            fp8,
            warpgroup.OperandMajorMode.K,
            warpgroup.OperandMajorMode.K,
            cutlass.Float32,
            (NUM_CONSUMER_WG, 1, 1),
            tiler_mn=(64, self.tile_n),
        )
        a_layout = self._smem_layout(TILE_M)
        b_layout = self._smem_layout(self.tile_n)
        s_layout = cute.make_layout((CHUNK_WORDS, 1, self.stages), stride=(1, 1, CHUNK_WORDS))
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_a, gA = cpasync.make_tiled_tma_atom(
            g2s, mA, cute.slice_(a_layout, (None, None, 0)), (TILE_M, TILE_K)
        )
        tma_b, gB = cpasync.make_tiled_tma_atom(
            g2s, mB, cute.slice_(b_layout, (None, None, 0)), (self.tile_n, TILE_K)
        )
        tma_sa, gSA = cpasync.make_tiled_tma_atom(
            g2s, mSA, cute.slice_(s_layout, (None, None, 0)), (CHUNK_WORDS, 1)
        )
        tma_sb, gSB = cpasync.make_tiled_tma_atom(
            g2s, mSB, cute.slice_(s_layout, (None, None, 0)), (CHUNK_WORDS, 1)
        )
        self.tx_bytes = (TILE_M + self.tile_n) * TILE_K + 2 * CHUNK_WORDS * 4

        sched = utils.PersistentTileSchedulerParams(
            ((m + TILE_M - 1) // TILE_M, self.n_tiles, 1), (1, 1, 1)
        )
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, self.cfg.num_ctas)

        stages = self.stages

        @cute.struct
        class Storage:
            load_bar: cute.struct.MemRange[cutlass.Int64, stages * 2]
            scale_bar: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[fp8, cute.cosize(a_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[fp8, cute.cosize(b_layout)], 1024]
            sSA: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, CHUNK_WORDS * stages], 128]
            sSB: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, CHUNK_WORDS * stages], 128]
            sFA: cute.struct.Align[
                cute.struct.MemRange[cutlass.Float32, CHUNK_WORDS * GROUPS_PER_TILE * stages], 128
            ]
            sFB: cute.struct.Align[
                cute.struct.MemRange[cutlass.Float32, CHUNK_WORDS * GROUPS_PER_TILE * stages], 128
            ]

        self.storage = Storage

        self.kernel(
            tma_a,
            gA,
            tma_b,
            gB,
            tma_sa,
            gSA,
            tma_sb,
            gSB,
            mD,
            mBias,
            m,
            tiled_mma,
            a_layout,
            b_layout,
            s_layout,
            sched,
        ).launch(
            grid=grid,
            block=[WG_THREADS * (1 + NUM_CONSUMER_WG), 1, 1],
            cluster=(1, 1, 1),
            min_blocks_per_mp=1,
            stream=stream,
        )

    def _smem_layout(self, rows: int):
        atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(
                utils.LayoutEnum.ROW_MAJOR, cutlass.Float8E4M3FN, TILE_K
            ),
            cutlass.Float8E4M3FN,
        )
        return cute.tile_to_shape(atom, (rows, TILE_K, self.stages), order=(0, 1, 2))

    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom,
        gA_full: cute.Tensor,
        tma_b: cute.CopyAtom,
        gB_full: cute.Tensor,
        tma_sa: cute.CopyAtom,
        gSA_full: cute.Tensor,
        tma_sb: cute.CopyAtom,
        gSB_full: cute.Tensor,
        mD: cute.Tensor,
        mBias: cute.Tensor,
        m: cutlass.Int32,
        tiled_mma: cute.TiledMma,
        a_layout: cute.ComposedLayout,
        b_layout: cute.ComposedLayout,
        s_layout: cute.Layout,
        sched_params: utils.PersistentTileSchedulerParams,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4

        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            cpasync.prefetch_descriptor(tma_sa)
            cpasync.prefetch_descriptor(tma_sb)

        smem = utils.SmemAllocator()
        st = smem.allocate(self.storage)

        load_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.load_bar.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, NUM_CONSUMER_WG * 4),
            tx_count=self.tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
            defer_sync=True,
        )
        scale_pipe = pipeline.PipelineAsync.create(
            barrier_storage=st.scale_bar.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONVERT_THREADS),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, NUM_CONSUMER_WG * WG_THREADS
            ),
            defer_sync=True,
        )
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sA = st.sA.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        sB = st.sB.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        sSA = st.sSA.get_tensor(s_layout)
        sSB = st.sSB.get_tensor(s_layout)
        f_layout = cute.make_layout(
            (CHUNK_WORDS, GROUPS_PER_TILE, self.stages),
            stride=(1, CHUNK_WORDS, CHUNK_WORDS * GROUPS_PER_TILE),
        )
        sFA = st.sFA.get_tensor(f_layout)
        sFB = st.sFB.get_tensor(f_layout)

        # (tile, tile, rest...) views of the TMA tensors
        gA = cute.local_tile(gA_full, (TILE_M, TILE_K), (None, None))
        gB = cute.local_tile(gB_full, (self.tile_n, TILE_K), (None, None))
        gSA = cute.local_tile(gSA_full, (CHUNK_WORDS, 1), (None, None))
        gSB = cute.local_tile(gSB_full, (CHUNK_WORDS, 1), (None, None))
        one = cute.make_layout(1)
        tAsA, tAgA = cpasync.tma_partition(
            tma_a, 0, one, cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2)
        )
        tBsB, tBgB = cpasync.tma_partition(
            tma_b, 0, one, cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2)
        )
        tSAs, tSAg = cpasync.tma_partition(
            tma_sa, 0, one, cute.group_modes(sSA, 0, 2), cute.group_modes(gSA, 0, 2)
        )
        tSBs, tSBg = cpasync.tma_partition(
            tma_sb, 0, one, cute.group_modes(sSB, 0, 2), cute.group_modes(gSB, 0, 2)
        )

        k_tiles = self.k_tiles
        if wg == 0:
            cute.arch.setmaxregister_decrease(40)
            if warp == 0:
                # ---- TMA producer ----
                sched = utils.StaticPersistentTileScheduler.create(
                    sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
                )
                work = sched.initial_work_tile_info()
                ps = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                while work.is_valid_tile:
                    tm = work.tile_idx[0]
                    tn = work.tile_idx[1]
                    b_chunk0 = ((tn * self.tile_n) // 128) * k_tiles
                    a_chunk0 = tm * k_tiles
                    for kt in range(k_tiles):
                        load_pipe.producer_acquire(ps)
                        bar = load_pipe.producer_get_barrier(ps)
                        cute.copy(
                            tma_a, tAgA[(None, tm, kt)], tAsA[(None, ps.index)], tma_bar_ptr=bar
                        )
                        cute.copy(
                            tma_b, tBgB[(None, tn, kt)], tBsB[(None, ps.index)], tma_bar_ptr=bar
                        )
                        cute.copy(
                            tma_sa,
                            tSAg[(None, 0, a_chunk0 + kt)],
                            tSAs[(None, ps.index)],
                            tma_bar_ptr=bar,
                        )
                        cute.copy(
                            tma_sb,
                            tSBg[(None, 0, b_chunk0 + kt)],
                            tSBs[(None, ps.index)],
                            tma_bar_ptr=bar,
                        )
                        load_pipe.producer_commit(ps)
                        ps.advance()
                    sched.advance_to_next_work()
                    work = sched.get_current_work()
                load_pipe.producer_tail(ps)
            if warp >= CONVERT_WARP0:
                # ---- scale decoder: E8M0 bytes -> FP32 (0 -> 2**-127, 0xFF -> NaN) ----
                ct = tidx - CONVERT_WARP0 * 32
                sched = utils.StaticPersistentTileScheduler.create(
                    sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
                )
                work = sched.initial_work_tile_info()
                cs = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
                ps = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                sFA_i = cute.recast_tensor(sFA, cutlass.Int32)
                sFB_i = cute.recast_tensor(sFB, cutlass.Int32)
                while work.is_valid_tile:
                    for _kt in range(k_tiles):
                        scale_pipe.producer_acquire(ps)
                        load_pipe.consumer_wait(cs)
                        for i in cutlass.range_constexpr(4):
                            w = ct + CONVERT_THREADS * (i % 2)
                            word = cutlass.Int32(0)
                            if cutlass.const_expr(i < 2):
                                word = sSA[w, 0, cs.index]
                            else:
                                word = sSB[w, 0, cs.index]
                            row = (w % 4) * 32 + w // 4
                            for g in cutlass.range_constexpr(GROUPS_PER_TILE):
                                b = (word >> (8 * g)) & 0xFF
                                special = cutlass.Int32(b == 0) | cutlass.Int32(b == 255)
                                bits = (b << 23) | (special << 22)
                                if cutlass.const_expr(i < 2):
                                    sFA_i[row, g, ps.index] = bits
                                else:
                                    sFB_i[row, g, ps.index] = bits
                        scale_pipe.producer_commit(ps)
                        ps.advance()
                        cs.advance()
                    sched.advance_to_next_work()
                    work = sched.get_current_work()
        else:
            cute.arch.setmaxregister_increase(232)
            self._consumer(
                tidx,
                tiled_mma,
                sA,
                sB,
                sFA,
                sFB,
                mD,
                mBias,
                m,
                load_pipe,
                scale_pipe,
                sched_params,
            )

    @cute.jit
    def _consumer(
        self,
        tidx,
        tiled_mma,
        sA,
        sB,
        sFA,
        sFB,
        mD,
        mBias,
        m,
        load_pipe,
        scale_pipe,
        sched_params,
    ):
        ct = tidx - WG_THREADS
        cwg = ct // WG_THREADS
        lane = ct % 32
        warp_in_wg = (ct % WG_THREADS) // 32
        thr_wg = tiled_mma.get_slice(cwg * WG_THREADS)
        tCrA = tiled_mma.make_fragment_A(thr_wg.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_wg.partition_B(sB))
        thr = tiled_mma.get_slice(ct)

        gD_tiles = cute.local_tile(mD, (TILE_M, self.tile_n), (None, None))
        acc_shape = thr_wg.partition_C(gD_tiles[(None, None, 0, 0)]).shape
        acc = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
        tmp = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
        tmp2 = cute.make_rmem_tensor(acc_shape, cutlass.Float32)

        # Rows and columns this thread holds in the wgmma accumulator (m64nNk32, FP32):
        # rows warp*16 + lane/4 (+8), columns 8j + 2*(lane%4) (+1).
        r0 = cwg * 64 + warp_in_wg * 16 + lane // 4
        c0 = 2 * (lane % 4)

        sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
        )
        work = sched.initial_work_tile_info()
        rs = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        pingpong = self.cfg.variant == "pingpong"
        if cutlass.const_expr(pingpong):
            if cwg == 1:
                self._turn_pass(cwg)  # warpgroup 0 promotes first

        while work.is_valid_tile:
            tm = work.tile_idx[0]
            tn = work.tile_idx[1]
            acc.fill(0.0)
            wg_row0 = tm * TILE_M + cwg * 64
            cb = (tn * self.tile_n) % 128 + c0
            warp_live = wg_row0 + warp_in_wg * 16 < m
            if wg_row0 < m:
                for _kt in range(self.k_tiles):
                    load_pipe.consumer_wait(rs)
                    scale_pipe.consumer_wait(rs)
                    self._k_tile(
                        tiled_mma,
                        acc,
                        tmp,
                        tmp2,
                        tCrA,
                        tCrB,
                        sFA,
                        sFB,
                        r0,
                        cb,
                        rs.index,
                        warp_live,
                        cwg,
                    )
                    load_pipe.consumer_release(rs)
                    scale_pipe.consumer_release(rs)
                    rs.advance()
                self._epilogue(acc, thr, gD_tiles, mBias, m, tm, tn)
            else:
                for _kt in range(self.k_tiles):
                    load_pipe.consumer_wait(rs)
                    scale_pipe.consumer_wait(rs)
                    if cutlass.const_expr(pingpong):
                        for _g in cutlass.range_constexpr(GROUPS_PER_TILE):
                            self._turn_wait(cwg)
                            self._turn_pass(cwg)
                    load_pipe.consumer_release(rs)
                    scale_pipe.consumer_release(rs)
                    rs.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        if cutlass.const_expr(pingpong):
            if cwg == 0:
                self._turn_wait(cwg)  # consume warpgroup 1's last pass

    @cute.jit
    def _turn_wait(self, cwg):
        if cwg == 0:
            cute.arch.barrier(barrier_id=TURN_BAR_WG0, number_of_threads=2 * WG_THREADS)
        else:
            cute.arch.barrier(barrier_id=TURN_BAR_WG1, number_of_threads=2 * WG_THREADS)

    @cute.jit
    def _turn_pass(self, cwg):
        if cwg == 0:
            cute.arch.barrier_arrive(barrier_id=TURN_BAR_WG1, number_of_threads=2 * WG_THREADS)
        else:
            cute.arch.barrier_arrive(barrier_id=TURN_BAR_WG0, number_of_threads=2 * WG_THREADS)

    @cute.jit
    def _wgmma(self, tiled_mma, tmp, tCrA, tCrB, g, stage):
        warpgroup.fence()
        cute.gemm(tiled_mma, tmp, tCrA[(None, None, g, stage)], tCrB[(None, None, g, stage)], tmp)
        warpgroup.commit_group()

    @cute.jit
    def _k_tile(self, tiled_mma, acc, tmp, tmp2, tCrA, tCrB, sFA, sFB, r0, cb, stage, live, cwg):
        """The 4 groups of one 128-wide K tile: wgmma each into a temporary, promote it."""
        variant = self.cfg.variant
        if cutlass.const_expr(variant == "serial"):
            # wait_group(0) before each promotion: the tensor cores stay busy with the other
            # consumer warpgroup's wgmma meanwhile.
            for g in cutlass.range_constexpr(GROUPS_PER_TILE):
                self._wgmma(tiled_mma, tmp, tCrA, tCrB, g, stage)
                warpgroup.wait_group(0)
                if live:
                    self._promote(acc, tmp, sFA, sFB, r0, cb, g, stage)
        if cutlass.const_expr(variant == "early"):
            # As "serial", but the scale loads and the 64 products sa*sb (tmp2) are computed
            # while the group's wgmma runs; after the wait only the FFMAs remain.
            for g in cutlass.range_constexpr(GROUPS_PER_TILE):
                self._wgmma(tiled_mma, tmp, tCrA, tCrB, g, stage)
                self._scale_products(tmp2, sFA, sFB, r0, cb, g, stage)
                warpgroup.wait_group(0)
                # no `if live` here: a branch would let the compiler sink the products
                # below the wait; rows past M are computed and never stored
                for i in cutlass.range_constexpr(cute.size(acc)):
                    acc[i] = acc[i] + tmp[i] * tmp2[i]
        if cutlass.const_expr(variant == "pingpong"):
            # As "serial", but the two consumer warpgroups take turns promoting (a token
            # passed through two named barriers): one promotes on the FP32 pipe while the
            # other's wgmma runs, instead of both promoting at once and then both waiting.
            for g in cutlass.range_constexpr(GROUPS_PER_TILE):
                self._wgmma(tiled_mma, tmp, tCrA, tCrB, g, stage)
                warpgroup.wait_group(0)
                self._turn_wait(cwg)
                if live:
                    self._promote(acc, tmp, sFA, sFB, r0, cb, g, stage)
                self._turn_pass(cwg)
        if cutlass.const_expr(variant == "overlap"):
            # Two temporaries: group g+1's wgmma is in flight while group g is promoted.
            # Drained once per K tile, so no wgmma is in flight across the loop back-edge
            # (register copies of in-flight accumulators there make ptxas serialize: C7514).
            self._wgmma(tiled_mma, tmp, tCrA, tCrB, 0, stage)
            for g in cutlass.range_constexpr(1, GROUPS_PER_TILE):
                self._wgmma(tiled_mma, tmp2 if g % 2 == 1 else tmp, tCrA, tCrB, g, stage)
                warpgroup.wait_group(1)
                if live:
                    self._promote(acc, tmp if g % 2 == 1 else tmp2, sFA, sFB, r0, cb, g - 1, stage)
            warpgroup.wait_group(0)
            if live:
                self._promote(acc, tmp2, sFA, sFB, r0, cb, GROUPS_PER_TILE - 1, stage)

    @cute.jit
    def _promote(self, acc, tmp, sFA, sFB, r0, cb, g, stage):
        """acc += tmp * sa[row, g] * sb[col, g]; each product is exact (powers of two)."""
        fa0 = sFA[r0, g, stage]
        fa1 = sFA[r0 + 8, g, stage]
        for j in cutlass.range_constexpr(self.tile_n // 8):
            for v in cutlass.range_constexpr(2):
                fb = sFB[cb + 8 * j + v, g, stage]
                i0 = v + 4 * j
                acc[i0] = acc[i0] + tmp[i0] * (fa0 * fb)
                acc[i0 + 2] = acc[i0 + 2] + tmp[i0 + 2] * (fa1 * fb)

    @cute.jit
    def _scale_products(self, prod, sFA, sFB, r0, cb, g, stage):
        """prod[i] = sa[row(i), g] * sb[col(i), g] for this thread's accumulator elements."""
        fa0 = sFA[r0, g, stage]
        fa1 = sFA[r0 + 8, g, stage]
        for j in cutlass.range_constexpr(self.tile_n // 8):
            for v in cutlass.range_constexpr(2):
                fb = sFB[cb + 8 * j + v, g, stage]
                prod[v + 4 * j] = fa0 * fb
                prod[v + 4 * j + 2] = fa1 * fb

    @cute.jit
    def _epilogue(self, acc, thr, gD_tiles, mBias, m, tm, tn):
        """Bias in FP32, round once, predicated stores of rows < M and columns < N."""
        gD = gD_tiles[(None, None, tm, tn)]
        cD = cute.local_tile(
            cute.make_identity_tensor((m, self.n)), (TILE_M, self.tile_n), (tm, tn)
        )
        tCgD = thr.partition_C(gD)
        tCcD = thr.partition_C(cD)
        for i in cutlass.range_constexpr(cute.size(acc)):
            coord = tCcD[i]
            if cute.elem_less(coord, (m, self.n)):
                v = acc[i]
                if cutlass.const_expr(self.has_bias):
                    v = v + mBias[coord[1]].to(cutlass.Float32)
                tCgD[i] = v.to(gD.element_type)
