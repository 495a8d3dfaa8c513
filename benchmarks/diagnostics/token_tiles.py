"""Diagnostic (not shipped): where the W8A16 token-tile kernel's time goes, from kernel
variants defined here as subclasses of the shipped kernel (the shipped source is untouched):

* ``shipped``: the kernel as shipped (one weight fragment per consumer: it converts a stage
  once the wgmmas of the one before are done);
* ``double-buffered``: two weight fragments per consumer, so a stage is converted while the
  wgmmas of the one before run (the consumer waits for the wgmmas two stages back, frees
  their stage, then waits for the next): the same wgmmas in the same order, so the same
  bits as ``shipped`` (docs/gemm_log.md, variant 58);
* ``no-convert``: the double-buffered loop without the weight's loads and conversion (wrong
  results on purpose): the TMA stream, the pipeline and the wgmmas alone, the ceiling of
  this design;
* ``packed``: the shipped loop on a weight whose bytes are permuted inside every 64 bytes of
  K so that each thread's fragment bytes of a stage row are one 16-byte chunk: one 16-byte
  shared load per row instead of eight 4-byte loads of which half the bytes are another
  thread's. It runs on a permuted copy of the weight (``permute_weight``) and must give the
  shipped kernel's bits on the natural one (docs/gemm_log.md, variant 59);
* ``blocked``: ``packed`` on a weight also laid out in stage blocks: the 128 rows x 64 K
  bytes of each (weight tile, K stage) contiguous (8 KB), so that a stage's load reads
  one block instead of 128 row pieces of 64 bytes (``block_weight``); the same bits;
* ``ping-pong``: the shipped loop with the two consumers taking turns to issue their
  wgmmas (named barriers: consumer 0 issues stage s, then consumer 1 stage s, then
  consumer 0 stage s + 1, ...), so each converts its next stage while the other's wgmmas
  run instead of both converting at once; the same wgmmas per consumer in the same order,
  so the same bits;
* ``packed-no-lds``: ``packed`` with the weight's shared loads replaced by words made from
  the thread's row (wrong results on purpose): the conversion's instructions without its
  shared-memory traffic, between ``packed`` and ``no-convert``.

Per case (a token-tile config at a token count), every variant and cuBLAS BF16 side by side
in one process: CUDA Graph replay cycling over weight copies beyond L2, interleaved per
round in rotated order, medians. Each variant's output is compared bitwise with
``shipped``'s first. The variants compile in parallel processes into a private kernel cache.

On an H100 or H200: ``python benchmarks/diagnostics/token_tiles.py --out DIR`` writes
DIR/gemm_diag_token_tiles.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

CASES = [  # (tokens, N, K, token tile, split tail)
    (64, 4096, 12288, 64, True),
    (128, 4096, 12288, 128, True),
    (64, 2048, 7168, 64, True),
    (256, 4096, 12288, 128, True),
    (1024, 4096, 12288, 256, False),
    (4096, 4096, 12288, 256, False),
    (512, 2048, 7168, 64, False),
    (1024, 2048, 7168, 128, False),
    (512, 7168, 14336, 256, False),
    (2048, 7168, 14336, 256, True),
    (1024, 11008, 4096, 256, False),
    (128, 7168, 43008, 128, True),
    (256, 7168, 43008, 256, True),
]
VARIANTS = (
    "shipped",
    "double-buffered",
    "no-convert",
    "packed",
    "blocked",
    "ping-pong",
    "packed-no-lds",
)
ROUNDS = 9


def _variant_class(variant: str):
    """The W8A16 swap-AB kernel class of ``variant`` (module doc)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32
    from cutlass.cute.nvgpu import warpgroup

    from mxfp8_fusion.format import CHUNK_BYTES, ROW_BLOCK
    from mxfp8_fusion.kernels.gemm_sm90.device.slices import (
        convert_fragment_natural,
        load_fragment_natural,
        pair_selector,
    )
    from mxfp8_fusion.kernels.gemm_sm90.swap_ab import w8a16
    from mxfp8_fusion.kernels.gemm_sm90.swap_ab.parts import TILE_W

    base = w8a16.W8A16SwapABGemmSm90
    if variant == "shipped":
        return base
    if variant == "ping-pong":
        return _ping_pong_class(base)
    if variant in ("packed", "blocked", "packed-no-lds"):
        return _packed_class(base, loads=variant != "packed-no-lds", blocked=variant == "blocked")

    class Variant(base):
        @cute.jit
        def _tile_stages(self, st, row0, t, w_tile, mma, load_pipe, ls, rel, k0, k1):
            tiled_mma, frag, frag_words, tCrB, acc = mma
            frag_b = tiled_mma.make_fragment_A(
                tiled_mma.get_slice(0).partition_shape_A((TILE_W, self.stage_k))
            )
            frags = (frag, frag_b)
            words = (frag_words, cute.recast_tensor(frag_b, Int32))
            blocks = self.stage_k // 16
            w8 = st.sW8.data_ptr().toint()
            sw = st.sSW.data_ptr().toint()
            selector = pair_selector(t)
            scale_row0 = (w_tile * self.tile_w) % ROW_BLOCK
            # pairs of stages, so that each stage's fragment is known at compile time
            for p in range((k1 - k0 + 1) // 2):
                for half in cutlass.range_constexpr(2):
                    ks = k0 + 2 * p + half
                    if ks < k1:
                        # the wgmmas two stages back read this fragment and their stage
                        warpgroup.wait_group(1)
                        if rel.count + 1 < ls.count:
                            load_pipe.consumer_release(rel)
                            rel.advance()
                        load_pipe.consumer_wait(ls)
                        if cutlass.const_expr(variant == "double-buffered"):
                            w_words, w_scales = load_fragment_natural(
                                w8 + ls.index * (self.tile_w * self.stage_k), row0, t,
                                sw + ls.index * CHUNK_BYTES, scale_row0, blocks,
                            )  # fmt: skip
                            convert_fragment_natural(
                                w_words, w_scales, selector, words[half], blocks, 2 * (ks % 2)
                            )  # fmt: skip
                        warpgroup.fence()
                        for kb in cutlass.range_constexpr(blocks):
                            cute.gemm(
                                tiled_mma, acc, frags[half][(None, None, kb)],
                                tCrB[(None, None, kb, ls.index)], acc,
                            )  # fmt: skip
                        warpgroup.commit_group()
                        ls.advance()
            # all but the last stage freed here; the shipped _tile_part frees that one
            warpgroup.wait_group(0)
            if rel.count + 1 < ls.count:
                load_pipe.consumer_release(rel)
                rel.advance()
            return ls, rel

    return Variant


PACKED_GROUP = 64
"""K bytes of one permuted group of ``packed``: one token-tile stage row."""


def packed_order() -> list[int]:
    """Byte p of a packed 64-byte group holds byte ``packed_order()[p]`` of the natural one:
    thread t's chunk t holds, for k16 block kb, the bytes 2t, 2t + 1, 2t + 8, 2t + 9 of the
    block, which its A fragment takes (pairs (2t, 2t + 1) and (2t + 8, 2t + 9))."""
    return [16 * kb + 2 * t + (j % 2) + 8 * (j // 2)
            for t in range(4) for kb in range(4) for j in range(4)]  # fmt: skip


def permute_weight(values):
    """The FP8 ``values`` [N, K] (K a multiple of 64) permuted as ``packed`` reads them."""
    import torch

    n, k = values.shape
    order = torch.tensor(packed_order(), device=values.device)
    u8 = values.view(torch.uint8).view(n, k // PACKED_GROUP, PACKED_GROUP)
    return u8[:, :, order].contiguous().view(values.dtype).view(n, k)


BLOCK_ROWS = 128
"""Weight rows of one ``blocked`` block: the token-tile kernel's weight tile."""


def block_weight(values):
    """``permute_weight(values)`` in blocks of 128 rows x 64 K bytes, each contiguous, the
    blocks of a 128-row band in K order, the bands in row order."""
    n, k = values.shape
    packed = permute_weight(values)
    blocks = packed.view(n // BLOCK_ROWS, BLOCK_ROWS, k // PACKED_GROUP, PACKED_GROUP)
    return blocks.permute(0, 2, 1, 3).contiguous().view(n, k)


def _packed_class(base, loads: bool, blocked: bool = False):
    """``packed``: the shipped stage loop, each row's fragment bytes one 16-byte load;
    without ``loads`` (``packed-no-lds``) words made from the row instead; ``blocked``
    reads the weight as :func:`block_weight` lays it out."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32
    from cutlass.cute.nvgpu import warpgroup

    from mxfp8_fusion.format import CHUNK_BYTES, ROW_BLOCK
    from mxfp8_fusion.kernels.gemm_sm90.device.common import (
        chunk_word,
        dequant_pair,
        load_smem_words,
        mul_bf16x2,
        scale_factors,
    )

    @cute.jit
    def load_packed(stage, row0, t, scales, scale_row0):
        """Rows row0 and row0 + 8 of a packed stage (rows of 64 bytes, 64-byte swizzle):
        chunk t of each, and each row's scale word."""
        words = []
        scale_words = []
        for rr in cutlass.range_constexpr(2):
            row = row0 + 8 * rr
            chunk = (t ^ ((row >> 1) % 4)) << 4
            scale_words.append(load_smem_words(scales + chunk_word(scale_row0 + row) * 4, 1, 4))
            if cutlass.const_expr(loads):
                words.append(load_smem_words(stage + row * PACKED_GROUP + chunk, 4, 16))
            else:  # per-stage values the compiler can neither fold nor hoist; no shared load
                fake = cute.make_rmem_tensor((4,), cutlass.Uint32)
                for q in cutlass.range_constexpr(4):
                    fake[q] = (
                        scale_words[rr][0] ^ cutlass.Uint32(row * 0x01010101 + q)
                    ) & 0x3F3F3F3F
                words.append(fake)
        return words, scale_words

    @cute.jit
    def convert_packed(words, scale_words, frag_words, group0):
        """Word kb of a row's chunk: bytes 0-1 the pair (2t, 2t + 1) of block kb, bytes
        2-3 the pair (2t + 8, 2t + 9); converted as the shipped kernel converts."""
        big = Int32(0)
        rests = []
        for rr in cutlass.range_constexpr(2):
            for j in cutlass.range_constexpr(2):
                s = Int32(scale_words[rr][0] >> (8 * (group0 + j))) & 0xFF
                factor, rest, is_big = scale_factors(s)
                rests.append(rest)
                big = big | is_big
                for kb in cutlass.range_constexpr(2 * j, 2 * j + 2):
                    for hi in cutlass.range_constexpr(2):
                        frag_words[rr + 2 * hi + 4 * kb] = dequant_pair(
                            words[rr][kb], factor, hi == 1
                        )  # fmt: skip
        if big != 0:
            for rr in cutlass.range_constexpr(2):
                for kb in cutlass.range_constexpr(4):
                    for hi in cutlass.range_constexpr(2):
                        idx = rr + 2 * hi + 4 * kb
                        frag_words[idx] = mul_bf16x2(frag_words[idx], rests[2 * rr + kb // 2])

    class Packed(base):
        @cute.jit
        def _launch(self, tokens, mSA, mW, mSW, mD, mBias, m, partials, flags, stream):
            if cutlass.const_expr(blocked):
                # element (n, k) of the logical weight where block_weight put it
                kb = self.k // PACKED_GROUP
                block = BLOCK_ROWS * PACKED_GROUP
                layout = cute.make_layout(
                    ((BLOCK_ROWS, self.n // BLOCK_ROWS), (PACKED_GROUP, kb)),
                    stride=((PACKED_GROUP, kb * block), (1, block)),
                )
                mW = cute.make_tensor(mW.iterator, layout)
            base._launch(self, tokens, mSA, mW, mSW, mD, mBias, m, partials, flags, stream)

        @cute.jit
        def _tile_stages(self, st, row0, t, w_tile, mma, load_pipe, ls, rel, k0, k1):
            tiled_mma, frag, frag_words, tCrB, acc = mma
            blocks = self.stage_k // 16
            w8 = st.sW8.data_ptr().toint()
            sw = st.sSW.data_ptr().toint()
            scale_row0 = (w_tile * self.tile_w) % ROW_BLOCK
            for ks in range(k0, k1):
                load_pipe.consumer_wait(ls)
                w_words, w_scales = load_packed(
                    w8 + ls.index * (self.tile_w * self.stage_k), row0, t,
                    sw + ls.index * CHUNK_BYTES, scale_row0,
                )  # fmt: skip
                warpgroup.wait_group(0)
                if rel.count < ls.count:
                    load_pipe.consumer_release(rel)
                    rel.advance()
                convert_packed(w_words, w_scales, frag_words, 2 * (ks % 2))
                warpgroup.fence()
                for kb in cutlass.range_constexpr(blocks):
                    cute.gemm(
                        tiled_mma, acc, frag[(None, None, kb)], tCrB[(None, None, kb, ls.index)], acc
                    )  # fmt: skip
                warpgroup.commit_group()
                ls.advance()
            return ls, rel

    return Packed


TURN_BAR = 4
"""``ping-pong``'s named barriers: TURN_BAR + c is consumer c's turn to issue (the shipped
kernel uses ids 1 to 3)."""


def _ping_pong_class(base):
    """``ping-pong``: the shipped stage loop, the consumers issuing their wgmmas in turn."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import warpgroup

    from mxfp8_fusion.format import CHUNK_BYTES, ROW_BLOCK
    from mxfp8_fusion.kernels.gemm_sm90.constants import WG_THREADS
    from mxfp8_fusion.kernels.gemm_sm90.device.slices import (
        convert_fragment_natural,
        load_fragment_natural,
        pair_selector,
    )
    from mxfp8_fusion.kernels.gemm_sm90.swap_ab.parts import TILE_W

    both = 2 * WG_THREADS

    class PingPong(base):
        @cute.jit
        def _tiles_consumer(
            self, cw, ct, cta, st, tiled_mma, sA16, mD, mBias, m, mPartials, mFlags, load_pipe
        ):  # fmt: skip
            if cw == 1:  # consumer 0 takes the first turn
                cute.arch.barrier_arrive(barrier_id=TURN_BAR, number_of_threads=both)
            base._tiles_consumer(
                self, cw, ct, cta, st, tiled_mma, sA16, mD, mBias, m, mPartials, mFlags, load_pipe
            )  # fmt: skip
            if cw == 0:  # consumer 1's arrive after its last turn
                cute.arch.barrier(barrier_id=TURN_BAR, number_of_threads=both)

        @cute.jit
        def _tile_stages(self, st, row0, t, w_tile, mma, load_pipe, ls, rel, k0, k1):
            tiled_mma, frag, frag_words, tCrB, acc = mma
            cw = row0 // TILE_W
            blocks = self.stage_k // 16
            w8 = st.sW8.data_ptr().toint()
            sw = st.sSW.data_ptr().toint()
            selector = pair_selector(t)
            scale_row0 = (w_tile * self.tile_w) % ROW_BLOCK
            for ks in range(k0, k1):
                load_pipe.consumer_wait(ls)
                w_words, w_scales = load_fragment_natural(
                    w8 + ls.index * (self.tile_w * self.stage_k), row0, t,
                    sw + ls.index * CHUNK_BYTES, scale_row0, blocks,
                )  # fmt: skip
                warpgroup.wait_group(0)
                if rel.count < ls.count:
                    load_pipe.consumer_release(rel)
                    rel.advance()
                convert_fragment_natural(
                    w_words, w_scales, selector, frag_words, blocks, 2 * (ks % 2)
                )  # fmt: skip
                cute.arch.barrier(barrier_id=TURN_BAR + cw, number_of_threads=both)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(blocks):
                    cute.gemm(
                        tiled_mma, acc, frag[(None, None, kb)], tCrB[(None, None, kb, ls.index)], acc
                    )  # fmt: skip
                warpgroup.commit_group()
                cute.arch.barrier_arrive(barrier_id=TURN_BAR + 1 - cw, number_of_threads=both)
                ls.advance()
            return ls, rel

    return PingPong


def compile_variant(variant: str, cfg, n: int, widths: tuple, out_dtype):
    """The compiled build of ``variant``'s kernel for ``cfg`` (a ``launcher.Build`` compiler)."""
    import cutlass

    from mxfp8_fusion.kernels.gemm_sm90.host import buffers
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as host
    from mxfp8_fusion.kernels.runtime import launcher

    out_ty = getattr(cutlass, host.CUTLASS_TYPES[out_dtype])
    kernel = _variant_class(variant)(cfg, n, widths, n, None, out_ty)
    args = host.compile_args(cfg, widths, out_dtype, None)
    return launcher.compile_kernel(kernel, args, buffers.ARCH)


def _config(tokens, tile, split):
    from mxfp8_fusion.kernels.gemm_sm90.config import swap_ab_config

    return swap_ab_config(tokens, 132, 2, True, 128, 1, "bf16", tile, split)


def _build(variant, tokens, n, k, tile, split):
    import torch

    from mxfp8_fusion.kernels.gemm_sm90.host import buffers
    from mxfp8_fusion.kernels.runtime import launcher

    facts = (variant, _config(tokens, tile, split), n, (k,), torch.bfloat16)
    return launcher.Build("gemm w8a16 diagnostic", facts, buffers.ARCH, compile_variant)


def _compile(job) -> str:
    from mxfp8_fusion.kernels.runtime import launcher

    t0 = time.perf_counter()
    try:
        launcher.function(_build(*job))
    except Exception as e:  # recorded; the other builds go on
        return f"{job}: {type(e).__name__}: {e}"[:400]
    return f"{job}: {time.perf_counter() - t0:.0f} s"


def _launch(build, cfg, x, w, out, tokens):
    """One launch of ``build`` on the one slice ``x`` (host.w8a16's argument order)."""
    from mxfp8_fusion.kernels.gemm_sm90.constants import MAX_SLICES
    from mxfp8_fusion.kernels.gemm_sm90.host import buffers
    from mxfp8_fusion.kernels.runtime import launcher

    unused = (None,) * (MAX_SLICES - 1)
    stream = launcher.raw_stream(0)
    args = (x.data_ptr(), *unused, x.stride(0), *unused, w.values.data_ptr(),
            w.scales.data_ptr(), None, out.data_ptr(), tokens)  # fmt: skip
    args += buffers.stream_workspace(cfg, x.device, 0, stream)
    launcher.launch(build, (*args, stream))


def _weights(d, variant):
    """The weight copies ``variant`` reads: ``d.wq``, or their permuted copies (made once)."""
    lay = {"packed": permute_weight, "blocked": block_weight}.get(variant)
    if lay is None:
        return d.wq
    if variant not in d.laid_out:
        from types import SimpleNamespace

        d.laid_out[variant] = [SimpleNamespace(values=lay(w.values), scales=w.scales) for w in d.wq]
    return d.laid_out[variant]


def _contenders(builds, cfg, d, outs, tokens) -> dict:
    """name -> (launch i -> None): each variant, and cuBLAS BF16 on the same tokens."""
    import torch

    x = d.x[:tokens]
    fns = {
        v: (
            lambda i, v=v: _launch(builds[v], cfg, x, _weights(d, v)[i % d.copies], outs[v], tokens)
        )
        for v in builds
    }
    fns["cublas_bf16"] = lambda i: torch.mm(x, d.w[i % d.copies].t(), out=outs["shipped"])
    return fns


def measure(variants) -> list[dict]:
    import torch
    from common import capture_graph
    from gemm_tools.points import MAX_INNER, _Data, _replay_ms

    rows = []
    for tokens, n, k, tile, split in CASES:
        cfg = _config(tokens, tile, split)
        d = _Data(n, k, tokens)
        d.laid_out = {}
        x = d.x[:tokens]
        outs = {v: torch.full((tokens, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                for v in variants}  # fmt: skip
        builds = {v: _build(v, tokens, n, k, tile, split) for v in variants}
        for v in variants:
            _launch(builds[v], cfg, x, _weights(d, v)[0], outs[v], tokens)
        torch.cuda.synchronize()
        same = {v: bool(torch.equal(outs[v], outs["shipped"])) for v in variants}
        inner = min(MAX_INNER, max(d.copies, int(2e13 // (2.0 * tokens * n * k)), 1))
        fns = _contenders(builds, cfg, d, outs, tokens)
        graphs = {
            name: capture_graph([lambda i=i, f=f: f(i) for i in range(inner)])
            for name, f in fns.items()
        }
        samples = {name: [] for name in graphs}
        names = list(graphs)
        for r in range(ROUNDS):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                samples[name].append(_replay_ms(graphs[name], inner, 0.02) * 1e3)
        us = {name: round(statistics.median(v), 2) for name, v in samples.items()}
        row = {"tokens": tokens, "n": n, "k": k, "token_tile": tile, "split_tail": split,
               "us": us, "bitwise_as_shipped": same,
               "over_shipped": {v: round(us[v] / us["shipped"], 3) for v in variants}}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
        del graphs
        torch.cuda.empty_cache()
    return rows


def launch_once(variants, cases) -> None:
    """Each variant launched once on each of ``cases`` (indices into CASES), for a profiler:
    ``ncu -k regex:"SwapAB|Packed|PingPong|Variant" ... token_tiles.py --once 7 4``."""
    import torch
    from gemm_tools.points import _Data

    for i in cases:
        tokens, n, k, tile, split = CASES[i]
        cfg = _config(tokens, tile, split)
        d = _Data(n, k, tokens)
        d.laid_out = {}
        out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
        for v in variants:
            _launch(_build(v, tokens, n, k, tile, split), cfg, d.x[:tokens], _weights(d, v)[0],
                    out, tokens)  # fmt: skip
            torch.cuda.synchronize()
        del d
        torch.cuda.empty_cache()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    p.add_argument("--receipt", default="gemm_diag_token_tiles.json", help="its file name in --out")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--once", nargs="+", type=int, metavar="CASE",
                   help="launch each variant once on these cases (indices), time nothing")  # fmt: skip
    args = p.parse_args()
    variants = ["shipped", *(v for v in args.variants if v != "shipped")]
    with tempfile.TemporaryDirectory() as cache:
        # the variants are not shipped builds: a private cache the compile workers share
        os.environ["MXFP8_FUSION_CACHE_DIR"] = cache
        cases = [CASES[i] for i in args.once] if args.once else CASES
        jobs = [(v, *case) for case in cases for v in variants]
        t0 = time.perf_counter()
        with ProcessPoolExecutor(args.workers) as pool:  # before CUDA starts here
            for line in pool.map(_compile, jobs):
                print("compiled", line, flush=True)
        compile_s = round(time.perf_counter() - t0, 1)
        if args.once:
            launch_once(variants, args.once)
            return
        rows = measure(variants)
    from common import environment

    what, variants_doc, how = __doc__.split("\n\n")[:3]
    receipt = {"what": what, "variants": variants_doc, "how": how,
               "compile_s": compile_s, "rounds": ROUNDS, "rows": rows, **environment()}  # fmt: skip
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / args.receipt).write_text(json.dumps(receipt, indent=1))


if __name__ == "__main__":
    main()
