"""The tiled GEMM's tile geometry and work split (gemm_sm90.tiled; imports cutlass: load
lazily): what its producer, converter and consumer roles all read. A config's tile shape,
warpgroups and stage counts become the kernel's compile-time facts here (refused where the
kernel has no form for them), and the jit methods below walk a CTA's (output tile, K stage)
units: whole tiles, stream-K, or whole waves with a stream-K tail.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from ....format import ROW_BLOCK, ceil_div, row_blocks
from .. import workspace
from ..constants import TILE_K8, TILE_K16, WG_THREADS
from ..device.common import Sm90Gemm

HALVES = TILE_K8 // TILE_K16  # 16-bit stages (K 64) per FP8 stage (K 128)
REF_STAGES = 2  # the ring of per-tile references and paths (gemm_sm90.tiled)
# (producer, converter, consumer) registers after setmaxnreg. Two consumers: the 64 x 128
# accumulator and the A fragment spilled at 128 in the BF16-only kernel (176 was
# faster). One converter: 512 threads launch with 128 registers each, 128 x 40 + 128 x 120
# + 256 x 176 = 65536. Two: 640 threads launch with 96, 128 x 32 + 256 x 48 + 256 x 176 =
# 61440. (Two converters with the consumers at 176 and the FP16 path measured faster;
# docs/gemm_log.md.)
# Three consumers (tile_m 192) with one converter: 640 threads, 128 x 32 + 128 x 64 + 384 x
# 128 = 61440, no spills. (Two converters would make 768 threads, whose 85 registers at
# launch are fewer than an m64n128 wgmma needs.)
# Stream-K's segment bookkeeping lives in the converters too: at 48 (two converters) and 64
# (three consumers) ptxas spills 56 and 36 bytes there. Two converters take 56 / 168, which
# spills 8 bytes (none with consumers at 176, where the converters spill). Three consumers
# keep 128 and let the converter spill: at 72 / 120 (no spills) the 192-row stream-K kernel
# ran slower per tile (docs/gemm_log.md, variant 46). Keyed by (converters,
# consumers, stream-K).
REGS = {
    (1, 2, False): (40, 120, 176),
    (2, 2, False): (32, 48, 176),
    (1, 3, False): (32, 64, 128),
    (1, 2, True): (40, 120, 176),
    (2, 2, True): (32, 56, 168),
    (1, 3, True): (32, 64, 128),
}
CONVERT_WG0 = 1  # warpgroups 1.. convert B; the last two or three convert A, run the wgmma
# Warp 1 of warpgroup 0 reads each tile's per-row FP16 reference bytes (gemm_sm90.device.refs) ahead
# of the tile and publishes them and the tile's path (gemm_sm90.device.f16) in a two-stage ring
# (REF_STAGES): words [0, tile_m) A rows, then 128 B rows (ref - 127), then the mode (1 =
# BF16).
SCAN_THREADS = 32


class TiledSchedule(Sm90Gemm):
    """The tiled kernel's compile-time geometry (from its config) and its work split. The
    roles (gemm_sm90.tiled.convert, gemm_sm90.tiled.consumer) and the kernel class derive
    from it, so every member they read is declared here or in :class:`Sm90Gemm`."""

    def __init__(self, cfg, n: int, k: int, ld_out: int, bias_dtype, out_dtype):
        super().__init__(n, k, ld_out, bias_dtype, out_dtype)
        self.cfg = cfg
        self.tile_n = cfg.tile_n
        # the B converter gives each of its threads whole 32-element units (_convert_b)
        if self.tile_n not in (64, 128):
            raise ValueError(f"tile_n must be 64 or 128, got {self.tile_n}")
        self.tile_m = cfg.tile_m
        if self.tile_m not in (64, 128, 192):
            raise ValueError(f"tile_m must be 64, 128 or 192, got {self.tile_m}")
        # 64-row tiles: two consumer warpgroups on the same rows, one per K half of every
        # FP8 stage (their sums added at the end of a segment); else one per 64 rows
        self.k_split = self.tile_m == 64
        # the k-split hand-off goes through the stream-K workspace, which only stream-K
        # launches get
        if self.k_split and not cfg.stream_k:
            raise ValueError(f"64-row tiles need stream_k, got {cfg}")
        self.row_blocks = self.tile_m // 64
        self.consumers = 2 if self.k_split else self.row_blocks
        # the stream-K workspace's slots (and flags) per CTA: gemm_sm90.workspace, by which the
        # host sizes it
        self.ws_blocks = workspace.slots_per_cta(cfg)
        self.convert_wgs = cfg.converters
        if (self.convert_wgs, self.consumers, False) not in REGS or (
            2 * self.tile_n < self.convert_wgs * WG_THREADS
        ):
            raise ValueError(f"converters must be 1, or 2 with tile 128 x 128, got {cfg}")
        # a tile's A rows span one 512-byte scale chunk per stage up to 128 rows, two at 192
        self.a_chunks = 1 if self.tile_m <= ROW_BLOCK else 2
        # ring words: A rows' references, then B rows', then the mode
        self.b_ref0 = self.tile_m
        self.mode_word = self.tile_m + 128
        self.ref_words = self.mode_word + 4
        self.convert_threads = self.convert_wgs * WG_THREADS
        self.consumer_wg0 = CONVERT_WG0 + self.convert_wgs
        self.stages8 = cfg.stages
        self.stages16 = cfg.stages16
        # the converter commits both halves of an FP8 stage together and the consumers
        # release each half one half late: two 16-bit stages deadlock (measured: a hang). A
        # k-split consumer reads every other half and releases it once it holds its next
        # one, so the converter's next pair needs a fourth stage (three measured a hang)
        min16 = 2 * HALVES if self.k_split else 2 * HALVES - 1
        if self.stages16 < min16:
            raise ValueError(f"stages16 must be at least {min16} here, got {cfg}")
        self.n_tiles = ceil_div(n, self.tile_n)
        self.b_chunks = row_blocks(n) * self.k_tiles
        self.stream_k = bool(cfg.stream_k)
        # stream_k 2: whole tiles for the full waves, stream-K over the rest (_waves); not
        # with k-split tiles (TiledConfig refuses it)
        self.sk_tail = cfg.stream_k == 2
        self.num_ctas_cap = cfg.num_ctas
        # a stream-K workspace part's values per thread (gemm_sm90.workspace)
        self.frag = workspace.frag(cfg)

    def _tiles(self, m):
        """Output tiles of ``m`` tokens."""
        return ceil_div(m, self.tile_m) * self.n_tiles

    @cute.jit
    def _my_units(self, m):
        """This CTA's (tile, K stage) units, tile-major: ``(start, stop, hop)``, where the
        segment after one ending at ``e`` starts at ``_next_unit(e, hop)``. Persistent:
        whole tiles cta, cta + G, ...; stream-K: units [cta U / G, (cta + 1) U / G);
        ``sk_tail``: whole tiles cta, cta + G, ... below ``_waves``' first tile, then this
        CTA's share of the units past it, split as in stream-K."""
        cta, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        units = self._tiles(m) * self.k_tiles
        start = cta * self.k_tiles
        stop = units
        hop = (grid - 1) * self.k_tiles  # from a whole tile's end to the next one's start
        if cutlass.const_expr(self.sk_tail):
            whole, sk_units = self._waves(m)
            whole_end = whole * self.k_tiles
            # in 64 bits: cta * U passes 2**31 past ~16M units
            sk_start = whole_end + Int32((cutlass.Int64(cta) * sk_units) // grid)
            stop = whole_end + Int32((cutlass.Int64(cta + 1) * sk_units) // grid)
            # a CTA below the whole tiles' count starts on its first whole tile
            start = cutlass.select_(whole > cta, start, sk_start)
            hop = (hop, whole_end, sk_start)
        elif cutlass.const_expr(self.stream_k):
            # in 64 bits: cta * U passes 2**31 past ~16M units
            start = Int32((cutlass.Int64(cta) * units) // grid)
            stop = Int32((cutlass.Int64(cta + 1) * units) // grid)
            hop = Int32(0)
        return start, stop, hop

    @cute.jit
    def _waves(self, m):
        """``sk_tail``: (tiles run whole, the units left for stream-K). The whole tiles fill
        the full waves of the grid, in tile order (M fastest: a wave's CTAs share B tiles in
        L2, which stream-K's scattered K offsets lose); the rest is split evenly. A thin rest
        takes the last full wave along: under an eighth of a wave it would split each of its
        tiles over many CTAs (one long fixup), and with fewer units than CTAs some would hold
        none, while the fixup waits for every CTA between a tile's first and last."""
        grid, _, _ = cute.arch.grid_dim()
        tiles = self._tiles(m)
        waves = tiles // grid
        rest = tiles - waves * grid
        thin = (rest * 8 < grid) | (rest * self.k_tiles < grid)
        waves = cutlass.select_((waves > 0) & thin, waves - 1, waves)
        whole = waves * grid
        return whole, (tiles - whole) * self.k_tiles

    @cute.jit
    def _next_unit(self, seg_end, hop):
        """The unit after a segment ending at ``seg_end`` (``hop`` from _my_units)."""
        if cutlass.const_expr(self.sk_tail):
            skip, whole_end, sk_start = hop
            nxt = seg_end + skip
            # a whole tile ends at or before whole_end, a stream-K segment past it
            whole = seg_end <= whole_end
            nxt = cutlass.select_(whole, cutlass.select_(nxt < whole_end, nxt, sk_start), seg_end)
        else:
            nxt = seg_end + hop
        return nxt

    @cute.jit
    def _segment(self, u, stop, m):
        """The segment starting at unit ``u``: (tile, row tile, column tile, first K stage,
        end K stage, end unit)."""
        t = u // self.k_tiles
        tm, tn = self._tile_mn(t, m)
        if cutlass.const_expr(not self.stream_k):
            # whole tiles: static K bounds (fewer live registers in the 192-row kernel)
            return t, tm, tn, 0, self.k_tiles, u + self.k_tiles
        seg_end = cutlass.min(stop, (t + 1) * self.k_tiles)
        return t, tm, tn, u - t * self.k_tiles, seg_end - t * self.k_tiles, seg_end

    @cute.jit
    def _tile_mn(self, idx, m):
        """(row tile, column tile) of the scheduler's linear tile: the full row tiles first,
        M fastest, then the partial row tile along N. The partial one has fewer live consumer
        warpgroups, so it is cheaper; last, it fills the final round. (M fastest over all row
        tiles puts it on the same CTAs every round when the grid is a multiple of the row
        tile count: 4096 tokens in 192-row tiles are 22 row tiles, 132 SMs.)"""
        full_m = m // self.tile_m
        full = full_m * self.n_tiles
        rows = cutlass.max(full_m, 1)
        in_full = idx < full
        return (
            cutlass.select_(in_full, idx % rows, full_m),
            cutlass.select_(in_full, idx // rows, idx - full),
        )
