"""The dequantize-in-shared-memory MXFP8 GEMM kernel for sm_90a (imports cutlass: load lazily).

An E4M3 value times a power of two is exactly a BF16 value (3 mantissa bits fit in 7; the
exponent range fits unless the product leaves BF16's range, where it rounds as the FP32
reference's product would overflow or lose precision). So instead of FP8 wgmma plus a
per-32-K FP32 promotion (two FP32 instructions per accumulator element per group: that
design measured 355-390 TFLOP/s, benchmarks/GEMM_LOG.md), a converter warpgroup turns
each FP8 tile and its E8M0 scales into a scaled BF16 tile in shared memory, and the
consumers run plain BF16 wgmma with FP32 accumulation. No promotion, no FP8 tensor-core
truncation: the only difference from the reference is summation order.

One CTA = 5 warpgroups (128 x tile_n output tile), persistent over output tiles:

* warpgroup 0, warp 0: TMA producer of the FP8 A/B tiles (K 128) and their 512-byte
  blocked-scale chunks (``load_pipe``);
* warpgroups 1-2: converters, FP8 stage -> two BF16 stages of K 64 (``conv_pipe``). Per
  16-element unit: one 16-byte shared load, 8 x (PRMT, SHL, AND, HMUL2), two 16-byte
  shared stores, conflict-free under the 128-byte swizzle;
* warpgroups 3-4: BF16 wgmma consumers, 64 rows each, one wgmma group in flight.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Int32, Uint32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cutlass_dsl import dsl_user_op

from .quantize_ptx import asm_u32

TILE_M = 128
TILE_K8 = 128  # FP8 K tile: 4 scale groups = one 512-byte chunk per 128 rows per stage
TILE_K16 = 64  # BF16 K tile: one 128-byte swizzle row
HALVES = TILE_K8 // TILE_K16
CHUNK_WORDS = 128
WG_THREADS = 128
CONVERT_WG0 = 1  # warpgroups 1-2 convert; 3-4 run the wgmma; warp 0 of warpgroup 0 loads
CONVERT_THREADS = 2 * WG_THREADS
CONSUMER_WG0 = 3
NUM_WG = 5
UNITS_PER_ROW = TILE_K16 // 16  # 16-element converter units per row of a BF16 stage
# E8M0 bytes up to this one give a BF16-normal factor 2**(s - 7) (see _dequant4)
ONE_FACTOR_MAX = 134

# A 16-bit lane of PRMT's sign-replicating select holds the E4M3 byte sign-extended; <<4 and
# this mask leave sign | 0000 | eeee mmm 0000, the BF16 bits of value * 2**-120 (subnormal
# E4M3 land on BF16 subnormals, zero on zero). NaN bytes are never paired with a finite
# scale by the quantizer (a NaN in a block makes the block's scale NaN).
_LANE_MASK = "0x87F087F0"


@dsl_user_op
def dequant_pair(word, factor, high: bool, *, loc=None, ip=None) -> Int32:
    """Bytes 0-1 (or 2-3) of ``word`` as a BF16x2 of ``e4m3 * 2**-120 * factor``."""
    selector = "0xB3A2" if high else "0x9180"
    return asm_u32(
        "{\n.reg .b32 t;\n"
        f"prmt.b32 t, $1, 0, {selector};\n"
        "shl.b32 t, t, 4;\n"
        f"and.b32 t, t, {_LANE_MASK};\n"
        "mul.rn.bf16x2 $0, t, $2;\n}",
        "=r,r,r",
        word,
        factor,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def mul_bf16x2(a, b, *, loc=None, ip=None) -> Int32:
    """Lane-wise BF16x2 product, round to nearest even (subnormals kept)."""
    return asm_u32("mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", a, b, loc=loc, ip=ip)


class MXFP8DequantGemmSm90:
    """Warp-specialized persistent MXFP8 GEMM: FP8 tiles -> scaled BF16 tiles -> BF16 wgmma."""

    def __init__(self, cfg, n: int, k: int, ld_out: int, bias_dtype, out_dtype):
        self.cfg = cfg
        self.out_dtype = out_dtype
        self.n = n
        self.k = k
        self.ld_out = ld_out
        self.has_bias = bias_dtype is not None
        self.bias_dtype = bias_dtype or out_dtype
        self.tile_n = cfg.tile_n
        self.stages8 = cfg.stages
        self.stages16 = cfg.bf16_stages
        self.k_tiles = (k + TILE_K8 - 1) // TILE_K8
        self.n_tiles = (n + self.tile_n - 1) // self.tile_n
        self.b_chunks = ((n + 127) // 128) * self.k_tiles

    @cute.jit
    def __call__(
        self,
        a_addr: cutlass.Int64,
        sa_addr: cutlass.Int64,
        b_addr: cutlass.Int64,
        sb_addr: cutlass.Int64,
        bias_addr: cutlass.Int64,
        out_addr: cutlass.Int64,
        m: cutlass.Int32,
        sa_chunks: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        fp8 = cutlass.Float8E4M3FN
        bf16 = cutlass.BFloat16
        # integer addresses in, pointers here: the host launches with plain scalars
        gmem = cute.AddressSpace.gmem
        a_ptr = cute.make_ptr(fp8, a_addr, gmem, assumed_align=16)
        sa_ptr = cute.make_ptr(cutlass.Int32, sa_addr, gmem, assumed_align=16)
        b_ptr = cute.make_ptr(fp8, b_addr, gmem, assumed_align=16)
        sb_ptr = cute.make_ptr(cutlass.Int32, sb_addr, gmem, assumed_align=16)
        bias_ptr = cute.make_ptr(
            self.bias_dtype, bias_addr, gmem, assumed_align=self.bias_dtype.width // 8
        )
        out_ptr = cute.make_ptr(self.out_dtype, out_addr, gmem, assumed_align=16)
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
            bf16,
            bf16,
            warpgroup.OperandMajorMode.K,
            warpgroup.OperandMajorMode.K,
            cutlass.Float32,
            (2, 1, 1),
            tiler_mn=(64, self.tile_n),
        )
        a8_layout = _smem_layout(fp8, TILE_M, TILE_K8, self.stages8)
        b8_layout = _smem_layout(fp8, self.tile_n, TILE_K8, self.stages8)
        a16_layout = _smem_layout(bf16, TILE_M, TILE_K16, self.stages16)
        b16_layout = _smem_layout(bf16, self.tile_n, TILE_K16, self.stages16)
        # one 512-byte scale chunk per operand per stage: tile N <= 128 rows lie in one chunk
        sa_layout = cute.make_layout((CHUNK_WORDS, 1, self.stages8), stride=(1, 1, CHUNK_WORDS))
        sb_layout = sa_layout
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_a, gA = cpasync.make_tiled_tma_atom(
            g2s, mA, cute.slice_(a8_layout, (None, None, 0)), (TILE_M, TILE_K8)
        )
        tma_b, gB = cpasync.make_tiled_tma_atom(
            g2s, mB, cute.slice_(b8_layout, (None, None, 0)), (self.tile_n, TILE_K8)
        )
        tma_sa, gSA = cpasync.make_tiled_tma_atom(
            g2s, mSA, cute.slice_(sa_layout, (None, None, 0)), (CHUNK_WORDS, 1)
        )
        tma_sb, gSB = cpasync.make_tiled_tma_atom(
            g2s, mSB, cute.slice_(sb_layout, (None, None, 0)), (CHUNK_WORDS, 1)
        )
        self.tx_bytes = (TILE_M + self.tile_n) * TILE_K8 + 2 * CHUNK_WORDS * 4

        sched = utils.PersistentTileSchedulerParams(
            ((m + TILE_M - 1) // TILE_M, self.n_tiles, 1), (1, 1, 1)
        )
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, self.cfg.num_ctas)

        stages8 = self.stages8
        stages16 = self.stages16

        @cute.struct
        class Storage:
            load_bar: cute.struct.MemRange[cutlass.Int64, stages8 * 2]
            conv_bar: cute.struct.MemRange[cutlass.Int64, stages16 * 2]
            sA8: cute.struct.Align[cute.struct.MemRange[fp8, cute.cosize(a8_layout)], 1024]
            sB8: cute.struct.Align[cute.struct.MemRange[fp8, cute.cosize(b8_layout)], 1024]
            sA16: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(a16_layout)], 1024]
            sB16: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(b16_layout)], 1024]
            sSA: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, CHUNK_WORDS * stages8], 128]
            sSB: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, CHUNK_WORDS * stages8], 128]

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
            a8_layout,
            b8_layout,
            a16_layout,
            b16_layout,
            sa_layout,
            sb_layout,
            sched,
        ).launch(
            grid=grid,
            block=[WG_THREADS * NUM_WG, 1, 1],
            cluster=(1, 1, 1),
            min_blocks_per_mp=1,
            stream=stream,
        )

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
        a8_layout: cute.ComposedLayout,
        b8_layout: cute.ComposedLayout,
        a16_layout: cute.ComposedLayout,
        b16_layout: cute.ComposedLayout,
        sa_layout: cute.Layout,
        sb_layout: cute.Layout,
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
            num_stages=self.stages8,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONVERT_THREADS // 32),
            tx_count=self.tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
            defer_sync=True,
        )
        conv_pipe = pipeline.PipelineAsync.create(
            barrier_storage=st.conv_bar.data_ptr(),
            num_stages=self.stages16,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONVERT_THREADS),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 2 * WG_THREADS),
            defer_sync=True,
        )
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        # 640 threads leave ptxas 96 registers per thread for every warp (setmaxnreg does not
        # raise its allocation limit), enough for a 64 x 128 FP32 accumulator per consumer
        # warpgroup; so no register reallocation between the roles. Warps 1-3 idle: the
        # converters need whole warpgroups' worth of threads (4 units each per K half).
        if warp == 0:
            sA8 = st.sA8.get_tensor(a8_layout.outer, swizzle=a8_layout.inner)
            sB8 = st.sB8.get_tensor(b8_layout.outer, swizzle=b8_layout.inner)
            sSA = st.sSA.get_tensor(sa_layout)
            sSB = st.sSB.get_tensor(sb_layout)
            self._producer(
                tma_a, gA_full, tma_b, gB_full, tma_sa, gSA_full, tma_sb, gSB_full,
                sA8, sB8, sSA, sSB, load_pipe, sched_params,
            )  # fmt: skip
        elif wg >= CONVERT_WG0 and wg < CONSUMER_WG0:
            self._converter(
                tidx - CONVERT_WG0 * WG_THREADS, st, m, load_pipe, conv_pipe, sched_params
            )
        elif wg >= CONSUMER_WG0:
            sA16 = st.sA16.get_tensor(a16_layout.outer, swizzle=a16_layout.inner)
            sB16 = st.sB16.get_tensor(b16_layout.outer, swizzle=b16_layout.inner)
            self._consumer(
                tidx - CONSUMER_WG0 * WG_THREADS, tiled_mma, sA16, sB16, mD, mBias, m, conv_pipe,
                sched_params,
            )  # fmt: skip

    @cute.jit
    def _producer(
        self, tma_a, gA_full, tma_b, gB_full, tma_sa, gSA_full, tma_sb, gSB_full,
        sA8, sB8, sSA, sSB, load_pipe, sched_params,
    ):  # fmt: skip
        gA = cute.local_tile(gA_full, (TILE_M, TILE_K8), (None, None))
        gB = cute.local_tile(gB_full, (self.tile_n, TILE_K8), (None, None))
        gSA = cute.local_tile(gSA_full, (CHUNK_WORDS, 1), (None, None))
        gSB = cute.local_tile(gSB_full, (CHUNK_WORDS, 1), (None, None))
        one = cute.make_layout(1)
        tAsA, tAgA = cpasync.tma_partition(
            tma_a, 0, one, cute.group_modes(sA8, 0, 2), cute.group_modes(gA, 0, 2)
        )
        tBsB, tBgB = cpasync.tma_partition(
            tma_b, 0, one, cute.group_modes(sB8, 0, 2), cute.group_modes(gB, 0, 2)
        )
        tSAs, tSAg = cpasync.tma_partition(
            tma_sa, 0, one, cute.group_modes(sSA, 0, 2), cute.group_modes(gSA, 0, 2)
        )
        tSBs, tSBg = cpasync.tma_partition(
            tma_sb, 0, one, cute.group_modes(sSB, 0, 2), cute.group_modes(gSB, 0, 2)
        )
        k_tiles = self.k_tiles
        sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
        )
        work = sched.initial_work_tile_info()
        ps = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages8)
        while work.is_valid_tile:
            tm = work.tile_idx[0]
            tn = work.tile_idx[1]
            b_chunk0 = ((tn * self.tile_n) // 128) * k_tiles
            a_chunk0 = tm * k_tiles
            for kt in range(k_tiles):
                load_pipe.producer_acquire(ps)
                bar = load_pipe.producer_get_barrier(ps)
                cute.copy(tma_a, tAgA[(None, tm, kt)], tAsA[(None, ps.index)], tma_bar_ptr=bar)
                cute.copy(tma_b, tBgB[(None, tn, kt)], tBsB[(None, ps.index)], tma_bar_ptr=bar)
                cute.copy(
                    tma_sa, tSAg[(None, 0, a_chunk0 + kt)], tSAs[(None, ps.index)], tma_bar_ptr=bar
                )
                cute.copy(
                    tma_sb, tSBg[(None, 0, b_chunk0 + kt)], tSBs[(None, ps.index)], tma_bar_ptr=bar
                )
                load_pipe.producer_commit(ps)
                ps.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        load_pipe.producer_tail(ps)

    @cute.jit
    def _converter(self, ct, st, m, load_pipe, conv_pipe, sched_params):
        """FP8 stage + raw scale chunks -> two scaled BF16 stages (K halves)."""
        a8 = st.sA8.data_ptr().toint()
        b8 = st.sB8.data_ptr().toint()
        a16 = st.sA16.data_ptr().toint()
        b16 = st.sB16.data_ptr().toint()
        sa = st.sSA.data_ptr().toint()
        sb = st.sSB.data_ptr().toint()
        sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
        )
        work = sched.initial_work_tile_info()
        ls = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages8)
        cs = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages16)
        while work.is_valid_tile:
            tm = work.tile_idx[0]
            tn = work.tile_idx[1]
            b_row0 = (tn * self.tile_n) % 128  # tile_n 64: the tile's rows within its chunk
            # at most 64 live A rows (few tokens): the second consumer warpgroup skips its
            # wgmma, so its 64 A rows need no conversion
            a_half = m - tm * TILE_M <= 64
            for _kt in range(self.k_tiles):
                load_pipe.consumer_wait(ls)
                first = cs.clone()
                for h in cutlass.range_constexpr(HALVES):
                    if cutlass.const_expr(h > 0):
                        cs.advance()
                    conv_pipe.producer_acquire(cs)
                    a_args = (
                        a8 + ls.index * (TILE_M * TILE_K8),
                        sa + ls.index * (CHUNK_WORDS * 4),
                        a16 + cs.index * (TILE_M * TILE_K16 * 2),
                    )
                    b_args = (
                        b8 + ls.index * (self.tile_n * TILE_K8),
                        sb + ls.index * (CHUNK_WORDS * 4),
                        b16 + cs.index * (self.tile_n * TILE_K16 * 2),
                    )
                    if a_half:
                        self._convert_units(ct, h, 64, a_args, self.tile_n, b_row0, b_args)
                    else:
                        self._convert_units(ct, h, TILE_M, a_args, self.tile_n, b_row0, b_args)
                # generic-proxy stores -> visible to wgmma (async proxy) after the barrier; one
                # fence per FP8 stage (both K halves), not per BF16 stage
                cute.arch.fence_proxy("async.shared", space="cta")
                conv_pipe.producer_commit(first)
                conv_pipe.producer_commit(cs)
                cs.advance()
                load_pipe.consumer_release(ls)
                ls.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()

    @cute.jit
    def _convert_units(self, ct, h: int, a_rows: int, a_args, b_rows: int, b_row0, b_args):
        """K half ``h`` of the FP8 stage -> the BF16 stage, A then B rows, no branches.

        Unit (row, j): 16 elements, K 64h + 16j.. of ``row``. Thread ct takes units
        ct + 256i: j = (ct / 8) % 4 and rows row_ct + 64i. Eight consecutive threads hold
        eight consecutive rows, so under the 128-byte swizzle (16-byte chunk c of row r at
        c ^ (r % 8)) each quarter-warp's loads and stores hit 8 distinct chunks. All of a
        thread's loads are issued before any conversion, and the rare second scale multiply
        (E8M0 byte > 134) is one branch for the batch: the units stay one basic block.
        Rows past M are converted too (up to ``a_rows``): they only feed output rows that are
        never stored.
        """
        smem = cute.AddressSpace.smem
        row_ct = (ct // 32) * 8 + ct % 8
        j = (ct // 8) % UNITS_PER_ROW
        sw = row_ct % 8  # rows row_ct + 64i share it
        group = 2 * h + j // 2
        units = []  # (row, row within the scale chunk, src, scales, dst)
        for rows, row0, args in ((a_rows, 0, a_args), (b_rows, b_row0, b_args)):
            for i in cutlass.range_constexpr(rows * UNITS_PER_ROW // CONVERT_THREADS):
                units.append((row_ct + 64 * i, row0 + row_ct + 64 * i, *args))
        words = []
        scale_words = []
        for row, r, src, scales, _dst in units:
            w = cute.make_rmem_tensor((4,), Uint32)
            src_addr = src + row * TILE_K8 + (((UNITS_PER_ROW * h + j) ^ sw) << 4)
            cute.autovec_copy(
                cute.make_tensor(
                    cute.make_ptr(Uint32, src_addr, smem, assumed_align=16), cute.make_layout(4)
                ),
                w,
            )
            words.append(w)
            # blocked layout: row r (< 128) of the stage's chunk is word (r % 32) * 4 + r // 32,
            # its group g the word's byte g
            sword = cute.make_rmem_tensor((1,), Int32)
            word_addr = scales + ((r % 32) * 4 + r // 32) * 4
            cute.autovec_copy(
                cute.make_tensor(
                    cute.make_ptr(Int32, word_addr, smem, assumed_align=4), cute.make_layout(1)
                ),
                sword,
            )
            scale_words.append(sword)
        outs = []
        big = Int32(0)
        second = []
        for n in cutlass.range_constexpr(len(units)):
            s = (scale_words[n][0] >> (8 * group)) & 0xFF
            e = cutlass.min(s, ONE_FACTOR_MAX) + 120  # factor 2**(s - 7) as BF16 bits
            factor = (e << 7) | (e << 23)
            # the rest of 2**(s - 7) past BF16's 2**127 (1.0 when none); 0xFF is NaN
            e2 = cutlass.max(s, ONE_FACTOR_MAX) - 7
            second.append(cutlass.select_(s == 255, Int32(0x7FC07FC0), (e2 << 7) | (e2 << 23)))
            big = big | Int32(s > ONE_FACTOR_MAX)
            # two 16-byte BF16 chunks: elements 0-7 (words 0-1), 8-15 (words 2-3)
            chunks = [cute.make_rmem_tensor((4,), Int32) for _ in range(2)]
            for w in cutlass.range_constexpr(4):
                for p in cutlass.range_constexpr(2):
                    chunks[w // 2][(2 * w + p) % 4] = dequant_pair(words[n][w], factor, p == 1)
            outs.append(chunks)
        if big != 0:
            for n in cutlass.range_constexpr(len(units)):
                for w in cutlass.range_constexpr(8):
                    outs[n][w // 4][w % 4] = mul_bf16x2(outs[n][w // 4][w % 4], second[n])
        for n in cutlass.range_constexpr(len(units)):
            row, _r, _src, _scales, dst = units[n]
            for half in cutlass.range_constexpr(2):
                dst_addr = dst + row * (TILE_K16 * 2) + (((2 * j + half) ^ sw) << 4)
                cute.autovec_copy(
                    outs[n][half],
                    cute.make_tensor(
                        cute.make_ptr(Int32, dst_addr, smem, assumed_align=16),
                        cute.make_layout(4),
                    ),
                )

    @cute.jit
    def _consumer(self, ct, tiled_mma, sA16, sB16, mD, mBias, m, conv_pipe, sched_params):
        cwg = ct // WG_THREADS
        thr_wg = tiled_mma.get_slice(cwg * WG_THREADS)
        tCrA = tiled_mma.make_fragment_A(thr_wg.partition_A(sA16))
        tCrB = tiled_mma.make_fragment_B(thr_wg.partition_B(sB16))
        thr = tiled_mma.get_slice(ct)
        gD_tiles = cute.local_tile(mD, (TILE_M, self.tile_n), (None, None))
        acc = cute.make_rmem_tensor(
            thr_wg.partition_C(gD_tiles[(None, None, 0, 0)]).shape, cutlass.Float32
        )
        k_blocks = cute.size(tCrA, mode=[2])
        steps = self.k_tiles * HALVES
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)

        sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
        )
        work = sched.initial_work_tile_info()
        rs = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages16)
        rel = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages16)
        while work.is_valid_tile:
            tm = work.tile_idx[0]
            tn = work.tile_idx[1]
            if tm * TILE_M + cwg * 64 < m:
                acc.fill(0.0)
                conv_pipe.consumer_wait(rs)
                self._mma_stage(tiled_mma, acc, tCrA, tCrB, k_blocks, rs.index)
                rs.advance()
                for _s in range(1, steps):
                    conv_pipe.consumer_wait(rs)
                    self._mma_stage(tiled_mma, acc, tCrA, tCrB, k_blocks, rs.index)
                    # the previous stage's wgmma is done once at most one group is pending
                    warpgroup.wait_group(1)
                    conv_pipe.consumer_release(rel)
                    rel.advance()
                    rs.advance()
                warpgroup.wait_group(0)
                conv_pipe.consumer_release(rel)
                rel.advance()
                self._epilogue(acc, thr, gD_tiles, mBias, m, tm, tn)
            else:
                # every row of this warpgroup lies past M: keep the pipeline in step only
                for _s in range(steps):
                    conv_pipe.consumer_wait(rs)
                    conv_pipe.consumer_release(rs)
                    rs.advance()
                    rel.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()

    @cute.jit
    def _mma_stage(self, tiled_mma, acc, tCrA, tCrB, k_blocks: int, stage):
        warpgroup.fence()
        for kb in cutlass.range_constexpr(k_blocks):
            cute.gemm(
                tiled_mma, acc, tCrA[(None, None, kb, stage)], tCrB[(None, None, kb, stage)], acc
            )
        warpgroup.commit_group()

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


def _smem_layout(dtype, rows: int, k: int, stages: int):
    """K-major 128-byte-swizzled stages: byte (r, c) of a stage at r*128 + (c ^ (r%8)*16)."""
    atom = warpgroup.make_smem_layout_atom(
        sm90_utils.get_smem_layout_atom(utils.LayoutEnum.ROW_MAJOR, dtype, k), dtype
    )
    return cute.tile_to_shape(atom, (rows, k, stages), order=(0, 1, 2))
