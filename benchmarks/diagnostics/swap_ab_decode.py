"""Diagnostic (not shipped): where a swap-AB GEMM launch spends its time at decode token
counts, and what its parts cost, from kernel variants defined here as subclasses of the
shipped kernel (the shipped source is untouched):

* ``shipped``: the kernel as shipped;
* ``no-convert``: the consumers neither convert the weight nor the tokens (wrong results on
  purpose): the TMA stream, the pipeline and the wgmmas alone;
* ``no-fixup``: a CTA holding a split tile's tail stores it without waiting for or adding the
  lower CTAs' parts (wrong results): what the stream-K fixup costs;
* ``no-convert no-fixup``: both;
* ``early-release`` (``bf16_tokens`` builds: W8A16 and from 17 tokens): each consumer frees
  its previous stage as soon as that stage's wgmmas are done, before it waits for its next
  stage's load, instead of after (the same wgmmas in the same order: the same bits). While a
  consumer waits for data it then holds no stage, so the producer has up to one stage per
  consumer more in flight.
* ``reversed``: in each segment consumer C - 1 takes the first stage and consumer 0 the
  last, so that consumer 0, which also adds the partial sums and stores or publishes the
  segment, takes the fewest stages where the segment's count is not a multiple of C;
* ``rotated``: the consumers take the CTA's stages in one round-robin across its segments
  (consumer c every stage whose CTA-local ordinal is c mod C), instead of starting over at
  consumer 0 in each segment;
* ``one-batch-fixup``: the fixup loads up to 128 FP32 values per thread at once instead of
  64 (``FIXUP_FLOATS``), so at 64 tokens all four lower parts of a split tile are in
  flight together instead of two at a time: the same additions in the same order. It
  spills registers with three consumers at 64 tokens: meant for two.

``reversed`` and ``rotated`` group the stages into other partial sums: other bits, the
same sum.

Each row records a hash of the output of its first launch, so the variants that keep the
bits can be checked against ``shipped`` (``same_bits_as_shipped``), and that output's
relative error (Frobenius) against the product of the dequantized operands (``rel_err``).

Each variant runs in its own process, beside cuBLAS BF16 on the same shape in that process
(CUDA Graph replay, interleaved, medians; ratios are ours / cuBLAS BF16 time), on the config
``choose_config`` picks. The ``shipped`` process also writes a timeline: per CTA the
%globaltimer at its consumers' start, when its segments are done (before the fixup) and at
its end, relative to the earliest CTA's start; the median CTA and the latest, medians over
12 eager launches; and (``per_cta``, CTA pairs aside) one launch CTA by CTA beside each CTA's
units, segments, split tail and the parts its fixup awaits, with the median and latest times
of each class of CTA.

On an H200: ``python benchmarks/diagnostics/swap_ab_decode.py --out DIR`` writes
DIR/gemm_diag_decode.json. ``--activation bf16`` runs the W8A16 kernel instead (the tokens
one BF16 slice, the weight converted in natural K order) on the config the W8A16 table picks;
``--cases T,N,K ...`` replaces the default points (``T,N,K,C``: the decode schedule with C
consumer warpgroups, one 64-row weight tile per stage, instead of the table's choice;
``T,N,K,2,128``: 128-row stages, each consumer finishing its own 64 rows;
``T,N,K,C,W,G``: on G CTAs instead of one per SM) and
``--receipt NAME`` the file name.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_timeline import STAMPS, geometry, per_cta, stamp_op, summary, timeline  # noqa: E402

CASES = [  # (tokens, N, K)
    (1, 4096, 12288),
    (8, 4096, 12288),
    (32, 4096, 12288),
    (8, 11008, 4096),
    (8, 7168, 14336),
    (32, 7168, 14336),
    (64, 7168, 14336),
]
VARIANTS = (
    "shipped", "no-convert", "no-fixup", "no-convert no-fixup", "early-release", "reversed",
    "rotated", "one-batch-fixup",
)  # fmt: skip
# the variants that keep the shipped bits
SAME_BITS = ("early-release", "one-batch-fixup")
ROUNDS = 9


def _stages_without_conversion():
    """The shipped consumer loop (``_segment_stages``) without the weight's and the tokens'
    conversion: the words its ``_load_weight_fragment`` hook loads go into the fragment as
    they are."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import warpgroup

    from mxfp8_fusion.format import CHUNK_BYTES, ROW_BLOCK
    from mxfp8_fusion.kernels.gemm_sm90.constants import TILE_K8
    from mxfp8_fusion.kernels.gemm_sm90.swap_ab.parts import K_STEPS

    @cute.jit
    def stages(self, cw, ct, row0, t, stride, count, tile, rank, smem, mma, load_pipe, ls, rel):
        w8, sw = smem[:2]
        tiled_mma, frag, frag_words, tCrB, acc = mma
        for _i in range(count):
            load_pipe.consumer_wait(ls)
            w_words, w_scales = self._load_weight_fragment(
                w8 + ls.index * (self.tile_w * TILE_K8), row0, t,
                sw + ls.index * CHUNK_BYTES, (self._w_tile(tile, rank) * self.tile_w) % ROW_BLOCK,
            )  # fmt: skip
            # every loaded word in load order (W8A8: two per load, W8A16: one)
            loaded = [w[j] for w in w_words for j in range(cute.size(w))]
            warpgroup.wait_group(0)
            if cutlass.const_expr(self.bf16_tokens):
                if rel.count < ls.count:
                    load_pipe.consumer_release(rel)
                    for _a in cutlass.range_constexpr(stride):
                        rel.advance()
            # the loaded bytes, unconverted, as the fragment (kept: the loads stay)
            for i in cutlass.range_constexpr(cute.size(frag_words)):
                frag_words[i] = loaded[i % len(loaded)] ^ w_scales[0][0]
            if cutlass.const_expr(not self.bf16_tokens):
                load_pipe.consumer_release(ls)
            tokens = 2 * ls.index if self.bf16_tokens else 2 * cw
            warpgroup.fence()
            for kb in cutlass.range_constexpr(K_STEPS):
                cute.gemm(
                    tiled_mma, acc, frag[(None, None, kb)],
                    tCrB[(None, None, kb % 4, tokens + kb // 4)], acc,
                )  # fmt: skip
            warpgroup.commit_group()
            for _a in cutlass.range_constexpr(stride):
                ls.advance()
        return ls, rel

    return stages


def _stages_released_early():
    """The shipped consumer loop of a ``bf16_tokens`` build with each stage released before
    the wait for the next one's load rather than after it (``early-release``)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import warpgroup

    from mxfp8_fusion.format import CHUNK_BYTES, ROW_BLOCK
    from mxfp8_fusion.kernels.gemm_sm90.constants import TILE_K8
    from mxfp8_fusion.kernels.gemm_sm90.swap_ab.parts import K_STEPS

    @cute.jit
    def stages(self, cw, ct, row0, t, stride, count, tile, rank, smem, mma, load_pipe, ls, rel):
        w8, sw = smem[:2]
        tiled_mma, frag, frag_words, tCrB, acc = mma
        selector = self._fragment_selector(t)
        for _i in range(count):
            # the previous stage's wgmmas have read its token tile and the fragment: free it
            # now, while this consumer waits for its next stage
            warpgroup.wait_group(0)
            if rel.count < ls.count:
                load_pipe.consumer_release(rel)
                for _a in cutlass.range_constexpr(stride):
                    rel.advance()
            load_pipe.consumer_wait(ls)
            w_words, w_scales = self._load_weight_fragment(
                w8 + ls.index * (self.tile_w * TILE_K8), row0, t,
                sw + ls.index * CHUNK_BYTES,
                (self._w_tile(tile, rank) * self.tile_w) % ROW_BLOCK,
            )  # fmt: skip
            self._convert_weight_fragment(w_words, w_scales, selector, frag_words)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(K_STEPS):
                cute.gemm(
                    tiled_mma, acc, frag[(None, None, kb)],
                    tCrB[(None, None, kb % 4, 2 * ls.index + kb // 4)], acc,
                )  # fmt: skip
            warpgroup.commit_group()
            for _a in cutlass.range_constexpr(stride):
                ls.advance()
        return ls, rel

    return stages


def _variant_class(variant: str, stamps_addr: int, base):
    """The kernel class of ``variant`` (module doc) over the shipped class ``base``, writing
    stamps where ``stamps_addr``."""
    import cutlass
    import cutlass.cute as cute

    no_convert = "no-convert" in variant
    if variant == "one-batch-fixup":
        from mxfp8_fusion.kernels.gemm_sm90.device import common

        common.FIXUP_FLOATS = 128  # read when the fixup is traced: this process's builds
    no_fixup = "no-fixup" in variant
    stamp = stamp_op(stamps_addr)
    without_conversion = _stages_without_conversion()
    early_release = _stages_released_early()

    class Variant(base):
        def _first_stage(self, cw, done):
            c = self.consumers
            if variant == "reversed":
                return c - 1 - cw
            if variant == "rotated":
                return (cw + c - done % c) % c
            return base._first_stage(self, cw, done)

        @cute.jit
        def _consumer(
            self, cw, ct, cta, begin, end, st, tiled_mma, sA16, mD, mBias, m, mPartials,
            mFlags, load_pipe,
        ):  # fmt: skip
            if cw == 0 and ct == 0:
                stamp(cta, 0)
            base._consumer(
                self, cw, ct, cta, begin, end, st, tiled_mma, sA16, mD, mBias, m, mPartials,
                mFlags, load_pipe,
            )  # fmt: skip
            if ct == 0 and cw == 0:
                stamp(cta, 2)

        @cute.jit
        def _fixup(self, ct, cw, cta, tile, thr, acc, mD, mBias, m, mPartials, mFlags):
            if ct == 0:
                stamp(cta, 1)
            if cutlass.const_expr(no_fixup):
                self._store_tile(thr, acc, mD, mBias, m, self._w_tile(tile, 0), cw, 0)
            else:
                base._fixup(self, ct, cw, cta, tile, thr, acc, mD, mBias, m, mPartials, mFlags)

        @cute.jit
        def _segment_stages(
            self, cw, ct, row0, t, stride, count, tile, rank, smem, mma, load_pipe, ls, rel
        ):  # fmt: skip
            step = without_conversion if no_convert else base._segment_stages
            if cutlass.const_expr(variant == "early-release" and self.bf16_tokens):
                step = early_release
            return step(
                self, cw, ct, row0, t, stride, count, tile, rank, smem, mma, load_pipe, ls, rel
            )  # fmt: skip

    return Variant


def _runner(activation: str, data, t: int, cfg):
    """launch i -> None: our GEMM on weight copy i of ``data`` at ``t`` tokens."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g
    from mxfp8_fusion.kernels.gemm_sm90.host import w8a16

    x, sx, out = data.inp.values[:t], data.inp.scales, data.out[:t]
    if activation == "bf16":  # W8A16: the BF16 tokens as one slice
        return lambda i: w8a16.run(
            [data.x[:t]], data.wq[i % data.copies].values, data.wq[i % data.copies].scales,
            None, out, config=cfg,
        )  # fmt: skip
    return lambda i: g.run(
        x, sx, data.wq[i % data.copies].values, data.wq[i % data.copies].scales, None, out,
        config=cfg,
    )  # fmt: skip


def _first_output(activation: str, data, t: int, cfg) -> tuple[str, float]:
    """One launch (its compile): a hash of its output, and the output's relative error
    (Frobenius) against the product of the dequantized operands."""
    import torch

    _runner(activation, data, t, cfg)(0)
    torch.cuda.synchronize()
    got = data.out[:t]
    digest = hashlib.sha256(got.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16]
    x = data.x[:t] if activation == "bf16" else data.xd[:t]
    exact = x.double() @ data.wd.double().t()
    return digest, ((got.double() - exact).norm() / exact.norm()).item()


def worker(variant: str, lock_path: str, out_path: str, activation: str, cases_arg: str) -> None:
    import torch
    from common import capture_graph
    from gemm_tools.points import MAX_INNER, _Data, _replay_ms

    from mxfp8_fusion.kernels.gemm_sm90.config import swap_ab_config
    from mxfp8_fusion.kernels.gemm_sm90.swap_ab import kernel as sab
    from mxfp8_fusion.kernels.gemm_sm90.swap_ab import w8a16 as sab16
    from mxfp8_fusion.kernels.gemm_sm90.tuning import select

    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.zeros(num_sms * len(STAMPS), dtype=torch.int64, device="cuda")
    stamped = variant == "shipped"
    stamps = buf.data_ptr() if stamped else 0
    if activation == "bf16":
        sab16.W8A16SwapABGemmSm90 = _variant_class(variant, stamps, sab16.W8A16SwapABGemmSm90)
    else:
        sab.MXFP8SwapABGemmSm90 = _variant_class(variant, stamps, sab.MXFP8SwapABGemmSm90)
    device = torch.cuda.get_device_name()
    cases = []
    for t, n, k, *schedule in json.loads(cases_arg):  # compile first, outside the lock
        data = _Data(n, k, t)
        if schedule:  # the decode schedule with these consumers (rows, CTAs), not the table's
            consumers = schedule[0]
            tile_w, ctas = (schedule[1:2] or [64])[0], (schedule[2:3] or [num_sms])[0]
            cfg = swap_ab_config(t, ctas, consumers, True, tile_w, 1, activation)
        else:
            cfg = select.choose_config(t, n, k, num_sms, device, activation)
        if cfg.kernel != "swap-ab" or getattr(cfg, "token_tiles", 0):
            print(f"{variant}: {t} x {n} x {k} runs {cfg}, not the decode schedule: skipped")
            continue
        cases.append((t, n, k, data, cfg, *_first_output(activation, data, t, cfg)))
    torch.cuda.synchronize()
    results = []
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for t, n, k, d, cfg, digest, rel_err in cases:
            inner = min(MAX_INNER, max(d.copies, int(2e13 // (2.0 * t * n * k)), 1))
            out = d.out[:t]
            ours = _runner(activation, d, t, cfg)

            def cublas(i, d=d, t=t, out=out):
                torch.mm(d.x[:t], d.w[i % d.copies].t(), out=out)

            graphs = {
                name: capture_graph([lambda i=i, f=f: f(i) for i in range(inner)])
                for name, f in (("ours", ours), ("cublas_bf16", cublas))
            }
            samples = {name: [] for name in graphs}
            for r in range(ROUNDS):
                for name in list(graphs) if r % 2 == 0 else list(graphs)[::-1]:
                    samples[name].append(_replay_ms(graphs[name], inner, 0.02) * 1e3)
            us = {name: statistics.median(v) for name, v in samples.items()}
            row = {"tokens": t, "n": n, "k": k, "config": str(cfg),
                   "schedule": f"{cfg.consumers} consumers, {cfg.stages} stages, cluster "
                               f"{cfg.cluster}, tile_w {cfg.tile_w}, up to {cfg.num_ctas} CTAs"
                               + (", tile-aligned" if cfg.tile_aligned else ""),
                   "ours_us": us["ours"], "cublas_bf16_us": us["cublas_bf16"],
                   "ours_over_cublas_bf16": us["ours"] / us["cublas_bf16"],
                   "out_sha256": digest, "rel_err": rel_err}  # fmt: skip
            if stamped:
                launches = []
                for i in range(12):
                    buf.zero_()
                    torch.cuda.synchronize()
                    ours(i)
                    torch.cuda.synchronize()
                    launches.append(timeline(buf, num_sms))
                row["timeline"] = summary(launches)
                if cfg.cluster == 1:
                    row["per_cta"] = per_cta(launches, geometry(cfg, n, k))
                    print(variant, t, n, k, json.dumps(row["per_cta"]["classes"]), flush=True)
            print(variant, json.dumps({k_: v for k_, v in row.items() if k_ != "config"}),
                  flush=True)  # fmt: skip
            results.append(row)
            del graphs
    Path(out_path).write_text(json.dumps(results))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--activation", choices=("mxfp8", "bf16"), default="mxfp8")
    p.add_argument(
        "--cases", nargs="+", help="T,N,K[,C[,W[,G]]] points (default: the module's CASES)"
    )
    p.add_argument("--receipt", default="gemm_diag_decode.json")
    args = p.parse_args()
    cases = [[int(v) for v in c.split(",")] for c in args.cases] if args.cases else CASES
    env = {**os.environ, "MXFP8_FUSION_CACHE_DIR": "off"}  # variants are not shipped builds
    with tempfile.TemporaryDirectory() as tmp:
        lock = str(Path(tmp) / "gpu.lock")
        procs = {
            v: subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    v,
                    lock,
                    str(Path(tmp) / f"{i}.json"),
                    args.activation,
                    json.dumps(cases),
                ],
                env=env,
            )
            for i, v in enumerate(args.variants)
        }
        receipt = {"what": __doc__.split("\n\n")[0], "activation": args.activation, "variants": {}}
        for i, (v, proc) in enumerate(procs.items()):
            proc.wait()
            path = Path(tmp) / f"{i}.json"
            receipt["variants"][v] = (
                json.loads(path.read_text()) if path.exists() else f"exit {proc.returncode}"
            )
    shipped = receipt["variants"].get("shipped")
    if isinstance(shipped, list):  # the bits of the variants that keep them
        bits = {(r["tokens"], r["n"], r["k"], r["schedule"]): r["out_sha256"] for r in shipped}
        for variant in SAME_BITS:
            rows = receipt["variants"].get(variant)
            for row in rows if isinstance(rows, list) else []:  # a failed variant: its exit
                key = (row["tokens"], row["n"], row["k"], row["schedule"])
                row["same_bits_as_shipped"] = bits.get(key) == row["out_sha256"]
                print(variant, key, "same bits as shipped:", row["same_bits_as_shipped"])
    from common import environment

    receipt.update(environment())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / args.receipt).write_text(json.dumps(receipt, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:])
    else:
        main()
