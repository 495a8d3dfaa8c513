"""The swap-AB GEMM's geometry and the parts of its consumers after the main loop
(gemm_sm90.swap_ab; imports cutlass: load lazily): a config becomes the kernel's
compile-time facts here (refused where the kernel has no form for them), the CTA groups of
a cluster, the token tile's loads and stores (the tokens converted in each CTA), and the
partial sums' reduction across consumers, stream-K fixup and store.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from ....format import CHUNK_BYTES, ceil_div, row_blocks
from .. import workspace
from ..config import aligned_groups
from ..constants import TILE_K8, TILE_K16, UNROLL_CHUNK, WG_THREADS
from ..device.common import (
    Sm90Gemm,
    add_parts,
    chunk_word,
    dequant_pair,
    load_smem_words,
    mul_bf16x2,
    scale_factors,
    store_flag,
    store_smem_word,
    wait_flag,
)

TILE_W = 64  # weight rows per consumer warpgroup: one wgmma M
K_STEPS = TILE_K8 // 16  # k16 wgmmas per stage
W_GROUPS = (0, 1, 2, 3)  # the stage's scale groups, all in one weight fragment
# named barriers: 1..C one per consumer warpgroup (its token tile), C + 1 the reduction


# L2 cache policy of a TMA load (the createpolicy encoding CUTLASS's CacheHintSm90 names
# EVICT_FIRST). On the weight stream, read once: slightly faster at 1 and 16 tokens
# (docs/gemm_log.md, 'Numbers behind the kernel sources').
L2_EVICT_FIRST = 0x12F0000000000000
# ... and the default priority (EVICT_NORMAL), spelled out for the multicast token loads,
# whose instruction always carries a policy
L2_EVICT_NORMAL = 0x1000000000000000


# Registers per thread: the register file over every thread of a CTA, and what the
# producer warpgroup keeps where the consumers take the rest (setmaxnreg counts are
# multiples of 8)
_REGISTERS = 65536
_PRODUCER_REGISTERS = 40


def consumer_registers(consumers: int) -> tuple[int, int]:
    """(producer, consumer) registers per thread of a W8A16 row-split build: a consumer holds
    64 weight rows x the token tile in FP32 (up to 128 registers at 256 tokens) besides its
    weight fragment; an even split (168 each with two consumers) spilled at every token
    tile."""
    rest = _REGISTERS - _PRODUCER_REGISTERS * WG_THREADS
    return _PRODUCER_REGISTERS, min(256, rest // (consumers * WG_THREADS) // 8 * 8)


class SwapABParts(Sm90Gemm):
    """The swap-AB kernel's compile-time geometry and its consumers' helpers. The kernel
    class (gemm_sm90.swap_ab) derives from it, so every member its methods read is declared
    here or in :class:`Sm90Gemm`."""

    def __init__(self, cfg, n: int, k: int, ld_out: int, bias_dtype, out_dtype):
        super().__init__(n, k, ld_out, bias_dtype, out_dtype)
        self.tn = cfg.tokens_tile
        # tokens already BF16 in the weight fragment's K order (gemm_sm90.device.tokens): TMA'd with
        # the stage, no conversion here
        self.bf16_tokens = bool(cfg.bf16_tokens)
        self.stages = cfg.stages
        self.consumers = cfg.consumers
        self.num_ctas_cap = cfg.num_ctas
        # weight rows per stage: 64, every consumer on alternate stages of them; or (row
        # split) 64 per consumer, all of them on every stage and its one token tile
        self.tile_w = cfg.tile_w
        self.row_split = self.tile_w != TILE_W
        if self.row_split and (not self.bf16_tokens or self.tile_w != TILE_W * self.consumers):
            raise ValueError(f"tile_w above 64 needs bf16_tokens and 64 rows per consumer: {cfg}")
        # each consumer takes every C-th stage (row split: every stage); with bf16_tokens it
        # holds its stage until it has its next one, so the producer needs a stage beyond
        # those held
        held = 1 if self.row_split else self.consumers
        if self.stages < held + int(self.bf16_tokens):
            raise ValueError(f"stages must be at least {held + int(self.bf16_tokens)}: {cfg}")
        # token_tiles: tokens in tiles of tn, whole (token tile, weight tile) pairs per CTA
        # (swap_ab.token_tiles); 0: one token tile, stream-K over the weight
        self.token_tiles = cfg.token_tiles
        self.split_tail = cfg.split_tail  # the last wave's tiles split over K (token tiles)
        # K per stage: 64 with token tiles (a 256-token tile's stage is 40 KB, so five of
        # them fit where two of K 128 did), else 128
        self.stage_k = TILE_K16 if self.token_tiles else TILE_K8
        self.k_stages = self.k // self.stage_k
        w8a16 = not cfg.activation.quantized
        self.registers = consumer_registers(self.consumers) if self.row_split and w8a16 else None
        # consumer warpgroups that read each stage: all of them with the row split
        self.stage_consumers = self.consumers if self.row_split else 1
        # the stream-K workspace's slots (and flags) per CTA and a part's values per thread
        self.ws_slots = workspace.slots_per_cta(cfg)
        self.ws_frag = workspace.frag(cfg)
        # CTA clusters (cfg.cluster 2): the two CTAs of a pair take adjacent weight tiles over
        # the same K stages, so each loads one K half of the stage's token tile for both
        self.cluster = cfg.cluster
        if self.cluster != 1 and not (self.cluster == 2 and self.bf16_tokens):
            raise ValueError(f"cluster 2 needs bf16_tokens: {cfg}")
        self.w_tiles = ceil_div(n, self.tile_w)
        self.w_chunks = row_blocks(n) * self.k_tiles
        # units: (group of `cluster` adjacent weight tiles, K stage), split over the groups
        # of CTAs; a CTA takes its own tile of each group (past N: zeros, never stored)
        tile_groups = ceil_div(self.w_tiles, self.cluster)
        self.units = tile_groups * self.k_tiles
        self.num_groups = min(self.num_ctas_cap // self.cluster, self.units)
        if cfg.tile_aligned:  # no CTA's units span two tiles (config.aligned_groups)
            self.num_groups = aligned_groups(tile_groups, self.k_tiles, self.num_groups)
        self.num_ctas = self.num_groups * self.cluster

    def _grid(self, m):
        """The launch's CTAs: every one the units are split over (token tiles: up to one per
        (token tile, weight tile) pair, or per tail part, swap_ab.token_tiles)."""
        if cutlass.const_expr(self.token_tiles):
            return [self._tiles_plan(m)[0] * self.cluster, 1, 1]
        return [self.num_ctas, 1, 1]

    def _group_rank(self, cta):
        """(CTA group, rank in it) of ``cta``: the CTA itself and 0 without clusters."""
        if cutlass.const_expr(self.cluster == 1):
            return cta, 0
        return cta // self.cluster, cta % self.cluster

    def _cta_of(self, group, rank):
        """The CTA of ``rank`` in CTA group ``group``."""
        if cutlass.const_expr(self.cluster == 1):
            return group
        return group * self.cluster + rank

    def _first_stage(self, cw, done):
        """The stage of a segment consumer ``cw`` takes first (then every C-th one), the CTA
        having taken ``done`` units before the segment: stage ``cw``."""
        return cw

    def _w_tile(self, group_tile, rank):
        """The weight tile a CTA of ``rank`` takes of the tile group ``group_tile``."""
        if cutlass.const_expr(self.cluster == 1):
            return group_tile
        return group_tile * self.cluster + rank

    @cute.jit
    def _reduce_consumers(self, cw, ct, st, acc):
        """Consumers 1.. hand their partial sums to consumer 0, which adds them in order."""
        if cutlass.const_expr(self.consumers > 1):
            red = st.sRed.get_tensor(
                cute.make_layout((cute.size(acc), WG_THREADS, self.consumers - 1))
            )
            everyone = self.consumers * WG_THREADS
            if cw > 0:
                for i in cutlass.range_constexpr(cute.size(acc)):
                    red[i, ct, cw - 1] = acc[i]
            cute.arch.barrier(barrier_id=1 + self.consumers, number_of_threads=everyone)
            if cw == 0:
                for c in cutlass.range_constexpr(1, self.consumers):
                    for i in cutlass.range_constexpr(cute.size(acc)):
                        acc[i] = acc[i] + red[i, ct, c - 1]
            # the next segment may overwrite ``red`` only after consumer 0 has read it
            cute.arch.barrier(barrier_id=1 + self.consumers, number_of_threads=everyone)

    @cute.jit
    def _finish_segment(
        self, u, seg_end, tile, tile_end, thr, acc, mD, mBias, m, ct, cw, cta, mPartials,
        mFlags, owned, rank,
    ):  # fmt: skip
        """A finishing consumer (consumer 0; each one with the row split) with the
        segment's sum (of its weight tile of tile group ``tile``): a whole tile is stored; a
        tile's tail is kept for the fixup (returns the tile group as the new ``owned``); a
        head or middle part is published for the CTA holding the tail."""
        slot = self._slot(cta, cw)
        if u == tile * self.k_tiles and seg_end == tile_end:
            self._store_tile(thr, acc, mD, mBias, m, self._w_tile(tile, rank), cw, 0)
        elif seg_end == tile_end:
            # the tile's tail: the fixup waits for the lower CTAs' parts at the end
            for i0 in cutlass.range_constexpr(0, cute.size(acc), UNROLL_CHUNK):
                for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, cute.size(acc))):
                    mPartials[i, ct, 1, slot] = acc[i]
            owned = tile
        else:
            # head or middle of the tile: publish it for the CTA holding the tail
            for i0 in cutlass.range_constexpr(0, cute.size(acc), UNROLL_CHUNK):
                for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, cute.size(acc))):
                    mPartials[i, ct, 0, slot] = acc[i]
            cute.arch.fence_acq_rel_gpu()
            cute.arch.barrier(barrier_id=self._bar(cw), number_of_threads=WG_THREADS)
            if ct == 0:
                store_flag(mFlags.iterator + slot, 1)
        return owned

    def _bar(self, cw):
        """The named barrier of finishing consumer ``cw``'s warpgroup."""
        return 1 + cw if self.row_split else 1

    def _slot(self, cta, cw):
        """The stream-K workspace slot (and flag) of ``cta``'s finishing consumer ``cw``."""
        return cta * self.ws_slots + cw if self.row_split else cta

    @cute.jit
    def _fixup(self, ct, cw, cta, tile, thr, acc, mD, mBias, m, mPartials, mFlags):
        """Sum the tile's parts in K order (published heads/middles of the lower CTA groups'
        CTAs of this rank, then this CTA's tail) and store it. Waits only on lower groups,
        which never wait on higher ones and start no later, so every wait ends. The lower
        parts' flags are awaited together (a thread each), then the parts are loaded several
        at a time (parts_in_flight) and added in order."""
        group, rank = self._group_rank(cta)
        first = ((tile * self.k_tiles + 1) * self.num_groups - 1) // self.units
        for c in range(first + ct, group, WG_THREADS):
            wait_flag(mFlags.iterator + self._slot(self._cta_of(c, rank), cw))
        cute.arch.barrier(barrier_id=self._bar(cw), number_of_threads=WG_THREADS)
        cute.arch.fence_acq_rel_gpu()
        acc.fill(0.0)
        add_parts(
            acc, first, group,
            lambda c: mPartials[None, ct, 0, self._slot(self._cta_of(c, rank), cw)],
        )  # fmt: skip
        for i0 in cutlass.range_constexpr(0, cute.size(acc), UNROLL_CHUNK):
            for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, cute.size(acc))):
                acc[i] = acc[i] + mPartials[i, ct, 1, self._slot(cta, cw)]
        self._store_tile(thr, acc, mD, mBias, m, self._w_tile(tile, rank), cw, 0)
        # every thread has read the parts: re-arm the flags for the next launch
        cute.arch.barrier(barrier_id=self._bar(cw), number_of_threads=WG_THREADS)
        for c in range(first + ct, group, WG_THREADS):
            store_flag(mFlags.iterator + self._slot(self._cta_of(c, rank), cw), 0)

    def _token_units(self, ct):
        """(row, 16-byte unit u) pairs of this thread: tokens_tile x 8 units per stage."""
        units = []
        for i in range(max(1, self.tn * 8 // WG_THREADS)):
            q = ct + WG_THREADS * i
            units.append((q % self.tn, q // self.tn))
        return units

    @cute.jit
    def _load_tokens(self, ct, a8, sa, stage):
        loaded = []
        for row, u in self._token_units(ct):
            words = cute.make_rmem_tensor((4,), Uint32)
            words.fill(0)
            scale = cute.make_rmem_tensor((1,), Uint32)
            scale.fill(0)
            if u < 8:  # tokens_tile 8 leaves half the threads without a unit
                addr = a8 + stage * (self.tn * TILE_K8) + row * TILE_K8 + ((u ^ (row % 8)) << 4)
                cute.autovec_copy(
                    cute.make_tensor(
                        cute.make_ptr(Uint32, addr, cute.AddressSpace.smem, assumed_align=16),
                        cute.make_layout(4),
                    ),
                    words,
                )
                scale[0] = load_smem_words(sa + stage * CHUNK_BYTES + chunk_word(row) * 4, 1, 4)[0]
            loaded.append((row, u, words, scale))
        return loaded

    @cute.jit
    def _store_tokens(self, loaded, a16):
        """Unit u = bytes 16u.. of the stage: word w's pairs go to the permuted K slots.

        Byte 4w + q of unit u is K 32b + 8t + 4i + q (b = u / 2, t = 2 (u % 2) + w / 2,
        i = w % 2); the weight fragment puts it at k16 block 2b + i, slot 2t + (q % 2) +
        8 (q / 2). As BF16 words of the stage: 16b + 8i + 4 (q / 2) + t, i.e. half b / 2,
        16-byte chunk 4 (b % 2) + 2i + q / 2, word t of the chunk.
        """
        for row, u, words, scale in loaded:
            if u < 8:
                b = u // 2
                s = Int32(scale[0] >> (8 * b)) & 0xFF
                factor, rest, _ = scale_factors(s)
                base = a16 + (b // 2) * (self.tn * TILE_K16 * 2) + row * (TILE_K16 * 2)
                for w in cutlass.range_constexpr(4):
                    t = 2 * (u % 2) + w // 2
                    for hi in cutlass.range_constexpr(2):
                        # branch-free: ``rest`` is 1.0 for scale bytes <= 134
                        v = mul_bf16x2(dequant_pair(words[w], factor, hi == 1), rest)
                        chunk = 4 * (b % 2) + 2 * (w % 2) + hi
                        store_smem_word(base + ((chunk ^ (row % 8)) << 4) + 4 * t, v)

    @cute.jit
    def _store_tile(self, thr, acc, mD, mBias, m, tile, cw, token0):
        """Accumulator (weight row, token) -> out[token0 + token, column], bias in FP32:
        column tile * 64 + row (row split: tile * tile_w + 64 cw + row)."""
        coords = thr.partition_C(cute.make_identity_tensor((TILE_W, self.tn)))
        row0 = tile * self.tile_w + cw * TILE_W if self.row_split else tile * TILE_W
        # in chunks: one static loop of 96 or 128 (192- and 256-token tiles) is slow to trace
        for i0 in cutlass.range_constexpr(0, cute.size(acc), UNROLL_CHUNK):
            for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, cute.size(acc))):
                row, token = coords[i]
                col = row0 + row
                if token0 + token < m and col < self.n:
                    self.store_output(mD, mBias, token0 + token, col, acc[i])

    @cute.jit
    def _run_producer(
        self, roles, tma_w, gW_full, tma_a, gA_full, tma_sw, gSW_full, tma_sa, gSA_full,
        w8_layout, a8_layout, a16_layout, s_layout,
    ):  # fmt: skip
        """Warp 0: the producer of the build's schedule."""
        cta, begin, end, rank, m, st, load_pipe = roles
        sW8 = st.sW8.get_tensor(w8_layout.outer, swizzle=w8_layout.inner)
        if cutlass.const_expr(self.bf16_tokens):
            sA8 = st.sA16.get_tensor(a16_layout.outer, swizzle=a16_layout.inner)
        else:
            sA8 = st.sA8.get_tensor(a8_layout.outer, swizzle=a8_layout.inner)
        sSW = st.sSW.get_tensor(s_layout)
        sSA = st.sSA.get_tensor(s_layout)
        if cutlass.const_expr(self.token_tiles):
            self._tiles_producer(cta, m, tma_w, gW_full, tma_a, gA_full, tma_sw, gSW_full,
                                 sW8, sA8, sSW, load_pipe)  # fmt: skip
        else:
            self._producer(
                cta, begin, end, rank, tma_w, gW_full, tma_a, gA_full, tma_sw, gSW_full,
                tma_sa, gSA_full, sW8, sA8, sSW, sSA, load_pipe,
            )  # fmt: skip

    @cute.jit
    def _run_consumer(self, roles, cw, ct, tiled_mma, a16_layout, mD, mBias, mPartials, mFlags):
        """Consumer warpgroup ``cw`` (thread ``ct`` of it) of the build's schedule."""
        cta, begin, end, _rank, m, st, load_pipe = roles
        sA16 = st.sA16.get_tensor(a16_layout.outer, swizzle=a16_layout.inner)
        if cutlass.const_expr(self.token_tiles):
            self._tiles_consumer(cw, ct, cta, st, tiled_mma, sA16, mD, mBias, m, mPartials,
                                 mFlags, load_pipe)  # fmt: skip
        else:
            self._consumer(cw, ct, cta, begin, end, st, tiled_mma, sA16, mD, mBias, m,
                           mPartials, mFlags, load_pipe)  # fmt: skip
