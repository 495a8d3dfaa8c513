"""The CuTe DSL slice quantizer on a CPU: it compiles for every target in ``ARCHS`` (sm_90a
and the Blackwell builds) with portable PTX, its launch geometry writes every destination
byte exactly once (a model of the work split), and the cheap ``refusal`` predicates
accept exactly what the kernel serves. The GPU tests are in test_quantize_kernel.py.
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

requires_cutlass = pytest.mark.skipif(
    importlib.util.find_spec("cutlass") is None, reason="nvidia-cutlass-dsl is not installed"
)

DTYPES = (torch.bfloat16, torch.float16)


# --- CPU: compile and predicate -----------------------------------------------------------


@requires_cutlass
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("width", [128, 7168])
def test_compiles_for_sm90a_without_gpu(dtype, width, monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from mxfp8_fusion.kernels.quantize import host as kernel

    config = kernel.QuantizerConfig(fp16=dtype == torch.float16, width=width)
    compiled = kernel.compile_kernel(config)
    assert compiled is not None


def test_one_build_per_compile_time_facts():
    from mxfp8_fusion.kernels.quantize import host as kernel

    a = torch.empty(5, 256, dtype=torch.bfloat16)
    b = torch.empty(4097, 512, dtype=torch.bfloat16)[:, :256]  # other tokens, other stride
    assert kernel.config_for(a) == kernel.config_for(b)
    assert kernel.build_of(kernel.config_for(a)) == kernel.build_of(kernel.config_for(b))
    # the target is a compile-time fact: another arch is another build
    blackwell = kernel.config_for(a, arch="sm_120a")
    assert blackwell != kernel.config_for(a) and blackwell.arch == "sm_120a"
    assert kernel.build_of(blackwell) != kernel.build_of(kernel.config_for(a))
    assert kernel.config_of(False, 256, 1, "sm_90a") == kernel.config_for(a)


def test_build_target_per_capability():
    from mxfp8_fusion.kernels.quantize import geometry
    from mxfp8_fusion.kernels.quantize import host as kernel

    assert kernel.arch_for((9, 0)) == "sm_90a"
    assert kernel.arch_for((10, 0)) == "sm_100a" and kernel.arch_for((10, 3)) == "sm_103a"
    assert kernel.arch_for((12, 0)) == "sm_120a" and kernel.arch_for((12, 1)) == "sm_121a"
    for unbuilt in [(8, 9), (9, 4), (11, 0), (13, 0)]:
        assert kernel.arch_for(unbuilt) is None
    with pytest.raises(ValueError, match="arch must be one of"):
        geometry.check_config(geometry.QuantizerConfig(fp16=False, width=128, arch="sm_89"))


# Instructions that exist only on Hopper (or need its machinery: TMA, transaction barriers,
# clusters, register reallocation) or only on some Blackwell parts: none may appear in the
# quantizer, or a build for another arch would not assemble or would not run.
_ARCH_SPECIFIC_PTX = ("wgmma", "cp.async.bulk", "mbarrier", "setmaxnreg", "cluster", "tcgen05")


@pytest.mark.slow
@requires_cutlass
def test_compiles_for_every_arch_with_portable_ptx(tmp_path):
    """CI proof for every target in ARCHS (sm_90a and the Blackwell builds): the one- and
    the many-slice kernels compile on this CPU-only machine, for that target, with PDL
    (griddepcontrol) and no Hopper- or Blackwell-specific instruction; no API the DSL has
    deprecated is used (its DeprecationWarnings are errors here)."""
    code = textwrap.dedent(
        """
        import json, warnings
        warnings.filterwarnings("error", message=r"cutlass\\.", category=DeprecationWarning)
        from mxfp8_fusion.kernels.quantize import host as kernel
        found = {}
        for arch in kernel.ARCHS.values():
            for config in (
                kernel.QuantizerConfig(fp16=False, width=7168, arch=arch),
                kernel.QuantizerConfig(fp16=True, width=1024, slices=6, arch=arch),
            ):
                ptx = kernel.compile_kernel(config).__ptx__
                lines = [line.split() for line in ptx.splitlines() if line.strip()]
                # an instruction's opcode, after its guard predicate ("@%p1 bra ...") if any
                ops = [words[1] if words[0][0] == "@" else words[0] for words in lines]
                found.setdefault(arch, []).append({
                    "target": [" ".join(words) for words in lines if words[0] == ".target"],
                    "opcodes": sorted({op.rstrip(";") for op in ops if op[0].isalpha()}),
                })
        print(json.dumps(found))
        """
    )
    env = dict(os.environ, CUTE_DSL_KEEP="ptx")  # keeps the PTX text (files land in tmp_path)
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    found = json.loads(res.stdout.strip().splitlines()[-1])
    from mxfp8_fusion.kernels.quantize.host import ARCHS

    assert sorted(found) == sorted(ARCHS.values())
    for arch, builds in found.items():
        for build in builds:
            assert build["target"] == [f".target {arch}"]
            opcodes = build["opcodes"]
            assert "griddepcontrol.wait" in opcodes and "cvt.rn.satfinite.e4m3x2.f32" in opcodes
            specific = [op for op in opcodes if any(word in op for word in _ARCH_SPECIFIC_PTX)]
            assert specific == [], f"{arch}: {specific}"


# Compile-time variants: both tile shapes in one kernel, the few-token tile off or 32 rows
# high, every tile height, one slice and several, a width the few-token tile cannot
# split 4 ways (3 column tiles), a plain launch instead of programmatic dependent launch.
VARIANTS = [
    dict(width=7168, slices=6),
    dict(width=7168, slices=6, small_tokens=0),
    dict(width=7168, slices=6, small_tokens=32),
    dict(width=1024, slices=1, tile_rows=16),
    dict(width=1024, slices=8, tile_rows=32),
    dict(width=1024, slices=2, tile_rows=128),
    dict(width=384, slices=3),
    dict(width=1024, slices=1, pdl=False),
]


@requires_cutlass
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}{v[k]}" for k in v))
def test_tile_variants_compile_for_sm90a(variant, monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from mxfp8_fusion.kernels.quantize import host as kernel

    assert kernel.compile_kernel(kernel.QuantizerConfig(fp16=False, **variant)) is not None


def test_launch_shape_follows_tokens():
    """Six 7168-wide slices: the few-token tile (16 rows x 4 column tiles) runs 84 CTAs up to
    16 tokens; past that, one CTA per 64 live rows and column tile, none for padding rows."""
    from mxfp8_fusion.kernels.quantize import geometry

    config = geometry.QuantizerConfig(fp16=False, width=7168, slices=6)
    assert geometry.shape_for(config, 1) == geometry.TileShape(16, 4)
    assert geometry.grid(config, 1) == (84, 1)
    assert geometry.grid(config, 16) == (84, 1)
    assert geometry.grid(config, 17) == (336, 1)
    assert geometry.grid(config, 128) == (336, 2)
    assert geometry.grid(config, 129) == (336, 3)
    assert geometry.grid(config, 4096) == (336, 64)
    off = geometry.QuantizerConfig(fp16=False, width=7168, slices=6, small_tokens=0)
    assert geometry.grid(off, 1) == (336, 1)
    assert geometry.small_shape(
        geometry.QuantizerConfig(fp16=False, width=384)
    ) == geometry.TileShape(16, 1)
    assert geometry.small_shape(
        geometry.QuantizerConfig(False, 1024, small_tokens=32)
    ) == geometry.TileShape(32, 2)


def _modelled_writes(config, tokens: int, k: int, columns: list[int]):
    """Destination bytes one launch writes, following the kernel's work split thread by
    thread (grid, tile shape, last-tile guards per warp, padding walk): value byte indices
    (row * k + column), live scale byte offsets, padding scale byte offsets."""
    from mxfp8_fusion.kernels.quantize import geometry

    shape = geometry.shape_for(config, tokens)
    few = config.small_tokens and tokens <= config.small_tokens
    grid_x, grid_y = geometry.grid(config, tokens)
    per_slice = config.width // 128 // shape.blocks
    g4 = (k // 32 + 3) // 4
    tidx = torch.arange(256)
    tx, ty, warp = tidx % 16, tidx // 16, tidx // 32
    values, live, padding = [], [], []
    for bx in range(grid_x):
        s, ct0 = bx // per_slice, bx % per_slice * shape.blocks
        column = columns[s]
        for by in range(grid_y):
            partial = few or by == (tokens - 1) // shape.rows
            for i in range(shape.rows // 16):
                row = by * shape.rows + ty + 16 * i
                if partial:
                    active = (by * shape.rows + 16 * i + 2 * warp < tokens) & (row < tokens)
                else:
                    assert bool((row < tokens).all()), "a full tile holds a padding row"
                    active = torch.ones(256, dtype=torch.bool)
                for c in range(shape.blocks):
                    col = column + (ct0 + c) * 128 + tx * 8
                    first = (row * k + col)[active]
                    values.append((first[:, None] + torch.arange(8)).flatten())
                    lead = active & (tx % 4 == 0)
                    r = row[lead]
                    live.append(
                        (column // 128 + ct0 + c) * 512
                        + (r // 128) * g4 * 512
                        + (r % 32) * 16
                        + (r // 32 % 4) * 4
                        + tx[lead] // 4
                    )
            if partial:
                row_block = (tokens - 1) // 128
                for kk in range(2 * shape.blocks):
                    prow = geometry.padding_row(row_block, ty, tx, kk % 2)
                    offset = (column // 128 + ct0) * 512 + row_block * g4 * 512
                    offset = offset + (kk // 2) * 512 + (kk % 2) * 256 + tidx
                    padding.append(offset[prow >= tokens])
    return torch.cat(values), torch.cat(live), torch.cat(padding)


# The same variants at a width the model walks quickly (1024 also splits 4 ways).
MODEL_VARIANTS = [dict(v, width=min(v["width"], 1024)) for v in VARIANTS]


@pytest.mark.slow
@pytest.mark.parametrize("variant", MODEL_VARIANTS, ids=lambda v: "-".join(f"{k}{v[k]}" for k in v))
def test_work_split_writes_each_byte_once(variant):
    """CPU model of the launch: every value byte of the live rows, every scale byte of the
    live rows and 127 for every padding row up to the 128-row boundary, each exactly once,
    and nothing else (no padding CTAs, no value bytes for padding rows)."""
    from mxfp8_fusion.format import scale_offset
    from mxfp8_fusion.kernels.quantize import geometry

    config = geometry.QuantizerConfig(fp16=False, **variant)
    width = config.width
    columns = [(2 * i + 1) * width for i in range(config.slices)]  # gaps between slices
    k = 2 * config.slices * width + 128
    for tokens in (1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 256, 257):
        values, live, padding = _modelled_writes(config, tokens, k, columns)
        rows = torch.arange(tokens)[:, None]
        cols = torch.cat([torch.arange(c, c + width) for c in columns])[None, :]
        want_values = (rows * k + cols).flatten()
        groups = (cols[:, ::32] // 32).flatten()
        want_live = scale_offset(rows, groups[None, :], k).flatten()
        pad_rows = torch.arange(tokens, (tokens + 127) // 128 * 128)[:, None]
        want_padding = scale_offset(pad_rows, groups[None, :], k).flatten()
        for got, want, what in (
            (values, want_values, "value"),
            (live, want_live, "scale"),
            (padding, want_padding, "padding scale"),
        ):
            assert got.numel() == got.unique().numel(), f"tokens {tokens}: {what} written twice"
            assert torch.equal(got.sort().values, want.sort().values), f"tokens {tokens}: {what}"


def test_import_does_not_import_cutlass():
    code = (
        "import sys; import mxfp8_fusion.kernels.quantize.host; "
        "sys.exit(1 if 'cutlass' in sys.modules else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


def test_refusal_names_what_the_kernel_cannot_do():
    from mxfp8_fusion.kernels.quantize.host import refusal

    values = torch.empty(256, 1024, dtype=torch.float8_e4m3fn)
    wide = torch.empty(256, 2048, dtype=torch.bfloat16)
    assert refusal(wide[:, 128:640], values, 512) is None
    assert refusal(wide[:1, 128:640], values, 0) is None
    assert "16-byte aligned" in refusal(wide[:, 4:516], values, 0)  # data pointer
    assert refusal(wide[:, 124:636], values, 0)
    assert "column 64" in refusal(wide[:, :512], values, 64)  # not a multiple of 128
    assert refusal(wide[:, :512], values, 768)  # past the destination
    assert refusal(wide[:, :200], values, 0)  # width not a multiple of 128
    assert refusal(wide[:, :512].float(), values, 0)  # dtype
    assert refusal(wide.t()[:256, :512], values, 0)  # column stride
    odd = torch.empty(256, 2052, dtype=torch.bfloat16)
    assert refusal(odd[:, :512], values, 0)  # row stride not a multiple of 8
    assert refusal(wide[:, :512], values[:, :1000], 0)  # destination not contiguous


def test_refusal_many_needs_equal_shapes():
    """Slices after the first must match its dtype and shape; each has its own layout,
    alignment and column."""
    from mxfp8_fusion.kernels.quantize.host import refusal_many

    values = torch.empty(256, 4096, dtype=torch.float8_e4m3fn)
    a = torch.empty(100, 512, dtype=torch.bfloat16)
    assert refusal_many([a, a.clone()], values, [0, 512]) is None
    assert refusal_many([a, a[:, :256]], values, [0, 512])
    assert refusal_many([a, a.half()], values, [0, 512])
    assert refusal_many([a] * 9, values, list(range(0, 4608, 512)))
    assert refusal_many([a, a], values, [0, 64])
    assert refusal_many([a, a], values, [0, 3840])  # the second runs past K
    wide = torch.empty(100, 1024, dtype=torch.bfloat16)
    assert refusal_many([a, wide[:, :512]], values, [0, 512]) is None  # each its own row stride
    odd = torch.empty(100, 516, dtype=torch.bfloat16)
    assert refusal_many([a, odd[:, :512]], values, [0, 512])  # rows not 16-byte aligned
    columns_major = torch.empty(512, 100, dtype=torch.bfloat16).t()
    assert refusal_many([a, columns_major], values, [0, 512])  # column stride 100
    flat = torch.empty(100 * 512 + 4, dtype=torch.bfloat16)
    shifted = flat[4:].view(100, 512)  # data 8 bytes past a 16-byte boundary
    assert refusal_many([a, shifted], values, [0, 512])
