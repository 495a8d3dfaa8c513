"""The CuTe DSL slice quantizer: compiles without a GPU, and is bitwise the reference on one.

CPU tests compile the kernel for every target in ``ARCHS`` (sm_90a and the Blackwell builds)
and check the cheap ``supported`` predicate. GPU tests (marked ``gpu``) compare every byte of the destination buffers against
``reference.quantize_slice_`` after poisoning them, so a write outside the slice fails too.
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from edge_cases import EDGE_BLOCK_NAMES, edge_block_tensor, expected_byte

from mxfp8_fusion import reference
from mxfp8_fusion.format import scale_bytes

requires_cutlass = pytest.mark.skipif(
    importlib.util.find_spec("cutlass") is None, reason="nvidia-cutlass-dsl is not installed"
)


def _has_kernel_gpu() -> bool:
    if not torch.cuda.is_available() or importlib.util.find_spec("cutlass") is None:
        return False
    from mxfp8_fusion.kernels.quantize_slice import arch_for

    return arch_for(torch.cuda.get_device_capability()) is not None


requires_sm90 = pytest.mark.skipif(
    not _has_kernel_gpu(), reason="needs a GPU the quantizer is built for and nvidia-cutlass-dsl"
)

DTYPES = (torch.bfloat16, torch.float16)
POISON_VALUES = 0x5A
POISON_SCALES = 0xA5


# --- CPU: compile and predicate -----------------------------------------------------------


@requires_cutlass
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("width", [128, 7168])
def test_compiles_for_sm90a_without_gpu(dtype, width, monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from mxfp8_fusion.kernels import quantize_slice as kernel

    config = kernel.QuantizerConfig(fp16=dtype == torch.float16, width=width)
    compiled = kernel.compile_kernel(config)
    assert compiled is not None


@requires_cutlass
def test_compile_cache_is_keyed_on_compile_time_facts(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from mxfp8_fusion.kernels import quantize_slice as kernel

    a = torch.empty(5, 256, dtype=torch.bfloat16)
    b = torch.empty(4097, 512, dtype=torch.bfloat16)[:, :256]  # other tokens, other stride
    assert kernel.config_for(a) == kernel.config_for(b)
    first = kernel._compiled(kernel.config_for(a))
    assert kernel._compiled(kernel.config_for(b)) is first
    # the target is a compile-time fact: another arch is another compile
    blackwell = kernel.config_for(a, arch="sm_120a")
    assert blackwell != kernel.config_for(a) and blackwell.arch == "sm_120a"
    assert kernel._compiled(blackwell) is not first


def test_build_target_per_capability():
    from mxfp8_fusion.kernels import quantize_geometry as geometry
    from mxfp8_fusion.kernels import quantize_slice as kernel

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


@requires_cutlass
def test_compiles_for_every_arch_with_portable_ptx(tmp_path):
    """CI proof for every target in ARCHS (sm_90a and the Blackwell builds): the one- and
    the many-slice kernels compile on this CPU-only machine, for that target, with PDL
    (griddepcontrol) and no Hopper- or Blackwell-specific instruction."""
    code = textwrap.dedent(
        """
        import json
        from mxfp8_fusion.kernels import quantize_slice as kernel
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
    from mxfp8_fusion.kernels.quantize_slice import ARCHS

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
    from mxfp8_fusion.kernels import quantize_slice as kernel

    assert kernel.compile_kernel(kernel.QuantizerConfig(fp16=False, **variant)) is not None


def test_launch_shape_follows_tokens():
    """Six 7168-wide slices: the few-token tile (16 rows x 4 column tiles) runs 84 CTAs up to
    16 tokens; past that, one CTA per 64 live rows and column tile, none for padding rows."""
    from mxfp8_fusion.kernels import quantize_geometry as geometry

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
    from mxfp8_fusion.kernels import quantize_geometry as geometry

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


@pytest.mark.parametrize("variant", MODEL_VARIANTS, ids=lambda v: "-".join(f"{k}{v[k]}" for k in v))
def test_work_split_writes_each_byte_once(variant):
    """CPU model of the launch: every value byte of the live rows, every scale byte of the
    live rows and 127 for every padding row up to the 128-row boundary, each exactly once,
    and nothing else (no padding CTAs, no value bytes for padding rows)."""
    from mxfp8_fusion.kernels import quantize_geometry as geometry

    from mxfp8_fusion.format import scale_offset

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


@requires_cutlass
def test_fast_launch_argument_layout_matches_the_dsl(monkeypatch):
    """The reusable argument buffers of run() mirror the DSL's own marshalling."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    import cuda.bindings.driver as cuda
    from mxfp8_fusion.kernels import quantize_slice as kernel
    from mxfp8_fusion.kernels.launcher import Launcher

    compiled = kernel._compiled(kernel.QuantizerConfig(fp16=False, width=256))
    probe = (1 << 40, (1 << 40) + 4096, (1 << 41) + 512, 4097, 1024, 2048, 768, 16, 0xABC)
    generic, _ = compiled.execution_args.generate_execution_args(
        (*probe[:-1], cuda.CUstream(probe[-1])), {}
    )
    launcher = Launcher(compiled, kernel._ONE_KINDS, probe)  # no GPU: generic path
    assert launcher._same_layout(generic, probe)
    assert not launcher._same_layout(generic, (*probe[:3], 4096, *probe[4:]))

    many = kernel._compiled(kernel.QuantizerConfig(fp16=False, width=256, slices=3))
    probe = (1 << 40, 1 << 41, 300, 768, 6, *range(1 << 42, (1 << 42) + 8))
    probe += (*range(256, 264), *range(0, 1024, 128), 0x5)
    generic, _ = many.execution_args.generate_execution_args(
        (*probe[:-1], cuda.CUstream(probe[-1])), {}
    )
    launcher = Launcher(many, kernel._MANY_KINDS, probe)
    assert launcher._same_layout(generic, probe)


def test_import_does_not_import_cutlass():
    code = (
        "import sys; import mxfp8_fusion.kernels.quantize_slice; "
        "sys.exit(1 if 'cutlass' in sys.modules else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


def test_supported_rejects_what_the_kernel_cannot_do():
    from mxfp8_fusion.kernels.quantize_slice import supported

    values = torch.empty(256, 1024, dtype=torch.float8_e4m3fn)
    wide = torch.empty(256, 2048, dtype=torch.bfloat16)
    assert supported(wide[:, 128:640], values, 512)
    assert supported(wide[:1, 128:640], values, 0)
    assert not supported(wide[:, 4:516], values, 0)  # data pointer not 16-byte aligned
    assert not supported(wide[:, 124:636], values, 0)
    assert not supported(wide[:, :512], values, 64)  # column not a multiple of 128
    assert not supported(wide[:, :512], values, 768)  # past the destination
    assert not supported(wide[:, :200], values, 0)  # width not a multiple of 128
    assert not supported(wide[:, :512].float(), values, 0)  # dtype
    assert not supported(wide.t()[:256, :512], values, 0)  # column stride
    odd = torch.empty(256, 2052, dtype=torch.bfloat16)
    assert not supported(odd[:, :512], values, 0)  # row stride not a multiple of 8
    assert not supported(wide[:, :512], values[:, :1000], 0)  # destination not contiguous


# --- GPU: bitwise equality ----------------------------------------------------------------


def _poisoned(capacity: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    values = torch.full((capacity, k), POISON_VALUES, dtype=torch.uint8, device=device)
    scales = torch.full(
        (scale_bytes(capacity, k),), POISON_SCALES, dtype=torch.uint8, device=device
    )
    return values.view(torch.float8_e4m3fn), scales.view(torch.float8_e8m0fnu)


def _check_against_reference(
    source: torch.Tensor, k: int, column: int, capacity=None, **launch
) -> None:
    """``launch``: compile-time options of ``run`` (``tile_rows``, ``small_tokens``)."""
    from mxfp8_fusion.kernels import quantize_slice as kernel

    tokens = source.shape[0]
    capacity = capacity or ((tokens + 127) // 128 * 128 + 128)
    values, scales = _poisoned(capacity, k, source.device)
    ref_values, ref_scales = _poisoned(capacity, k, source.device)
    assert kernel.supported(source, values, column)
    kernel.run(source, values, scales, column, **launch)
    reference.quantize_slice_(source, ref_values, ref_scales, column)
    got_v, want_v = values.view(torch.uint8), ref_values.view(torch.uint8)
    got_s, want_s = scales.view(torch.uint8), ref_scales.view(torch.uint8)
    if not torch.equal(got_v, want_v):
        bad = (got_v != want_v).nonzero()[:5].tolist()
        details = [(r, c, int(got_v[r, c]), int(want_v[r, c])) for r, c in bad]
        pytest.fail(f"value bytes differ at (row, col, got, want): {details}")
    if not torch.equal(got_s, want_s):
        bad = (got_s != want_s).nonzero()[:5].flatten().tolist()
        details = [(i, int(got_s[i]), int(want_s[i])) for i in bad]
        pytest.fail(f"scale bytes differ at (offset, got, want): {details}")


def _wide_range(tokens: int, width: int, dtype, device, generator) -> torch.Tensor:
    """Random data whose per-element magnitudes span most of the dtype's exponent range."""
    lo, hi = (-120, 120) if dtype == torch.bfloat16 else (-22, 13)
    x = torch.randn(tokens, width, device=device, generator=generator)
    exp = torch.randint(lo, hi, (tokens, width // 32, 1), device=device, generator=generator)
    spread = torch.randint(-12, 1, (tokens, width), device=device, generator=generator)
    x = x.view(tokens, width // 32, 32) * torch.exp2(exp.float())
    x = x.view(tokens, width) * torch.exp2(spread.float())
    x[torch.rand(tokens, width, device=device, generator=generator) < 0.02] = 0.0
    return x.to(dtype)


# (tokens, width) pairs: the requested token counts at a few widths, kept to a size that runs
# in seconds; 16384 covers the widest slice.
SHAPES = [
    (1, 128),
    (7, 128),
    (128, 384),
    (129, 128),
    (4097, 128),
    (1, 7168),
    (7, 1024),
    (128, 7168),
    (129, 1024),
    (4096, 384),
    (4097, 1024),
    (7, 16384),
    (129, 16384),
]


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize(("tokens", "width"), SHAPES)
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_bitwise_equal_to_reference(dtype, tokens, width, where):
    gen = torch.Generator(device="cuda").manual_seed(tokens * 131 + width)
    k = 3 * width if where == "middle" else 2 * width + 128
    column = {"start": 0, "middle": width, "end": k - width}[where]
    source = _wide_range(tokens, width, dtype, "cuda", gen)
    _check_against_reference(source, k, column)


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("tokens", [1, 7, 129, 4097])
def test_strided_source_view(dtype, tokens):
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    wide = _wide_range(tokens, 3072, dtype, "cuda", gen)
    source = wide[:, 1024:2048]  # row stride 3072, data pointer 2 KiB into each row
    assert source.stride(0) == 3072
    _check_against_reference(source, 4096, 2048)


@pytest.mark.gpu
@requires_sm90
def test_six_slices_equal_quantize_of_the_concatenation():
    gen = torch.Generator(device="cuda").manual_seed(6)
    slices = [_wide_range(300, 1024, torch.bfloat16, "cuda", gen) for _ in range(6)]
    from mxfp8_fusion.kernels import quantize_slice as kernel

    values, scales = _poisoned(300, 6144, "cuda")
    for i, s in enumerate(slices):
        kernel.run(s, values, scales, i * 1024)
    want_v, want_s = reference.quantize(torch.cat(slices, dim=1))
    assert torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("tokens", [1, 16, 300])
def test_eager_multi_slice_call_is_one_launch(monkeypatch, tokens):
    """``quantize_input_slices`` with six equal slices takes the one-launch kernel and writes
    the bytes of the one-shot quantizer on the concatenation."""
    from mxfp8_fusion.kernels import dispatch

    import mxfp8_fusion as mf

    launches = []
    run_many = dispatch.quantize_slices

    def counting(*args):
        launches.append(run_many(*args))  # True: the one-launch kernel served the call
        return launches[-1]

    monkeypatch.setattr(dispatch, "quantize_slices", counting)
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    slices = [_wide_range(tokens, 768, torch.bfloat16, "cuda", gen) for _ in range(6)]
    dest = mf.empty_input(tokens + 5, 6 * 768, "cuda")
    mf.quantize_input_slices(slices, dest)
    assert launches == [True]
    want = mf.quantize(torch.cat(slices, -1))
    assert torch.equal(dest.values[:tokens].view(torch.uint8), want.values.view(torch.uint8))
    live = scale_bytes(tokens, 6 * 768)
    assert torch.equal(dest.scales[:live].view(torch.uint8), want.scales.view(torch.uint8))


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("tokens", [1, 129, 300])
def test_run_many_equals_per_slice_reference(dtype, tokens):
    """One launch for several slices: views with their own strides, columns out of order and
    with gaps (the gap columns must stay poisoned)."""
    from mxfp8_fusion.kernels import quantize_slice as kernel

    gen = torch.Generator(device="cuda").manual_seed(tokens + 77)
    wide = _wide_range(tokens, 2048, dtype, "cuda", gen)
    sources = [
        _wide_range(tokens, 512, dtype, "cuda", gen),
        wide[:, 512:1024],
        wide[:, 1536:2048],
        _wide_range(tokens, 512, dtype, "cuda", gen),
        _wide_range(tokens, 512, dtype, "cuda", gen),
    ]
    columns = [2560, 0, 1024, 3584, 512]  # [1536, 2560) and [3072, 3584) stay untouched
    capacity, k = 512, 4096
    values, scales = _poisoned(capacity, k, "cuda")
    want_v, want_s = _poisoned(capacity, k, "cuda")
    assert kernel.supported_many(sources, values, columns)
    kernel.run_many(sources, values, scales, columns)
    for source, column in zip(sources, columns, strict=True):
        reference.quantize_slice_(source, want_v, want_s, column)
    assert torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("tokens", [1, 64])  # the few-token tile and the default one
def test_run_many_cuda_graph_replay(tokens):
    from mxfp8_fusion.kernels import quantize_slice as kernel

    gen = torch.Generator(device="cuda").manual_seed(21)
    sources = [_wide_range(tokens, 1024, torch.bfloat16, "cuda", gen) for _ in range(6)]
    columns = [i * 1024 for i in range(6)]
    values, scales = _poisoned(128, 6144, "cuda")
    kernel.run_many(sources, values, scales, columns)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel.run_many(sources, values, scales, columns)
    for s in sources:
        s.copy_(_wide_range(tokens, 1024, torch.bfloat16, "cuda", gen))
    graph.replay()
    want_v, want_s = reference.quantize(torch.cat(sources, dim=1))
    torch.cuda.synchronize()
    assert torch.equal(values.view(torch.uint8)[:tokens], want_v.view(torch.uint8))
    assert bool((values.view(torch.uint8)[tokens:] == POISON_VALUES).all())
    assert torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))


def _check_many_with_padding(sources, columns, k: int, capacity: int, **launch) -> None:
    """run_many into poisoned buffers: bitwise the per-slice reference; and, checked apart
    from the reference, scale byte 127 for the rows [tokens, roundup(tokens, 128)) of every
    group of the slices, poison left in value rows past ``tokens``, in the columns no slice
    owns and in the row blocks past the 128-row boundary."""
    from mxfp8_fusion.kernels import quantize_slice as kernel

    from mxfp8_fusion.format import scale_offset

    tokens, width = sources[0].shape
    values, scales = _poisoned(capacity, k, "cuda")
    want_v, want_s = _poisoned(capacity, k, "cuda")
    assert kernel.supported_many(sources, values, columns)
    kernel.run_many(sources, values, scales, columns, **launch)
    for source, column in zip(sources, columns, strict=True):
        reference.quantize_slice_(source, want_v, want_s, column)
    got_v, got_s = values.view(torch.uint8), scales.view(torch.uint8)
    if not torch.equal(got_v, want_v.view(torch.uint8)):
        bad = (got_v != want_v.view(torch.uint8)).nonzero()[:5].tolist()
        pytest.fail(f"value bytes differ at (row, col): {bad}")
    if not torch.equal(got_s, want_s.view(torch.uint8)):
        bad = (got_s != want_s.view(torch.uint8)).nonzero()[:5].flatten().tolist()
        pytest.fail(f"scale bytes differ at offsets {bad}")
    padded = (tokens + 127) // 128 * 128
    groups = torch.cat([torch.arange(c // 32, (c + width) // 32) for c in columns])
    pad_rows = torch.arange(tokens, padded)[:, None]
    pad = scale_offset(pad_rows, groups[None, :], k).flatten().to(got_s.device)
    assert bool((got_s[pad] == 127).all()), "padding rows must hold scale byte 127"
    assert bool((got_v[tokens:] == POISON_VALUES).all()), "value rows past tokens written"
    owned = torch.zeros(k, dtype=torch.bool)
    for c in columns:
        owned[c : c + width] = True
    assert bool((got_v[:, ~owned.to(got_v.device)] == POISON_VALUES).all())
    g4 = (k // 32 + 3) // 4
    assert bool((got_s[padded // 128 * g4 * 512 :] == POISON_SCALES).all())


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("tokens", [1, 2, 16, 17, 127, 128, 129])
@pytest.mark.parametrize(
    ("tile_rows", "small_tokens"), [(64, 16), (64, 0), (64, 32), (16, 16), (32, 32), (128, 16)]
)
def test_run_many_few_tokens_padding(tokens, tile_rows, small_tokens):
    """Few tokens through every tile shape: the few-token tile, the last (partial) row tile
    with its warp guards and padding walk, and tiles wholly past ``tokens`` (not launched)."""
    gen = torch.Generator(device="cuda").manual_seed(tokens * 7 + tile_rows + small_tokens)
    width = 1024
    wide = _wide_range(tokens, 3 * width, torch.bfloat16, "cuda", gen)
    sources = [wide[:, width : 2 * width]]  # a strided view
    sources += [_wide_range(tokens, width, torch.bfloat16, "cuda", gen) for _ in range(5)]
    columns = [4096, 0, 2048, 1024, 6144, 5120]  # [3072, 4096) and [7168, 7296) untouched
    _check_many_with_padding(
        sources, columns, 7296, 384, tile_rows=tile_rows, small_tokens=small_tokens
    )


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("tokens", [1, 16, 127, 129])
def test_run_many_benchmark_geometry_few_tokens(dtype, tokens):
    """The benchmark's six 7168-wide slices (14 few-token CTAs per slice) into a wider
    destination whose last 256 columns belong to no slice."""
    gen = torch.Generator(device="cuda").manual_seed(tokens + 1000)
    sources = [_wide_range(tokens, 7168, dtype, "cuda", gen) for _ in range(6)]
    columns = [i * 7168 for i in range(6)]
    _check_many_with_padding(sources, columns, 6 * 7168 + 256, 256)


def test_supported_many_needs_equal_shapes():
    """Slices after the first must match its dtype and shape; each has its own layout,
    alignment and column."""
    from mxfp8_fusion.kernels.quantize_slice import supported_many

    values = torch.empty(256, 4096, dtype=torch.float8_e4m3fn)
    a = torch.empty(100, 512, dtype=torch.bfloat16)
    assert supported_many([a, a.clone()], values, [0, 512])
    assert not supported_many([a, a[:, :256]], values, [0, 512])
    assert not supported_many([a, a.half()], values, [0, 512])
    assert not supported_many([a] * 9, values, list(range(0, 4608, 512)))
    assert not supported_many([a, a], values, [0, 64])
    assert not supported_many([a, a], values, [0, 3840])  # the second runs past K
    wide = torch.empty(100, 1024, dtype=torch.bfloat16)
    assert supported_many([a, wide[:, :512]], values, [0, 512])  # each its own row stride
    odd = torch.empty(100, 516, dtype=torch.bfloat16)
    assert not supported_many([a, odd[:, :512]], values, [0, 512])  # rows not 16-byte aligned
    columns_major = torch.empty(512, 100, dtype=torch.bfloat16).t()
    assert not supported_many([a, columns_major], values, [0, 512])  # column stride 100
    flat = torch.empty(100 * 512 + 4, dtype=torch.bfloat16)
    shifted = flat[4:].view(100, 512)  # data 8 bytes past a 16-byte boundary
    assert not supported_many([a, shifted], values, [0, 512])


# --- edge-case blocks ---------------------------------------------------------------------


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_edge_case_blocks(dtype):
    gen = torch.Generator(device="cuda").manual_seed(1)
    names, rows = [], []
    for name in EDGE_BLOCK_NAMES:
        names.append(name)
        rows.append(edge_block_tensor(name, dtype).float()[0])
    blocks = torch.stack(rows)  # [n, 32]
    # Every block at every group position of a 128-column tile, in shuffled element order.
    n = blocks.shape[0]
    perm = torch.stack([torch.randperm(32) for _ in range(4 * n)]).view(4 * n, 32)
    tiled = blocks.repeat(4, 1).gather(1, perm).view(4, n, 32).permute(1, 0, 2).reshape(n, 128)
    source = tiled.to(dtype).cuda()
    _check_against_reference(source, 384, 128)
    # And the scale bytes the rule pins down, independently of the reference.
    from mxfp8_fusion.kernels import quantize_slice as kernel

    from mxfp8_fusion.format import scale_offset

    values, scales = _poisoned(128, 128, "cuda")
    kernel.run(source, values, scales, 0)
    scales_cpu = scales.view(torch.uint8).cpu()
    for row, name in enumerate(names):
        want = expected_byte(name, dtype)
        got = [int(scales_cpu[scale_offset(row, g, 128)]) for g in range(4)]
        assert got == [want] * 4, f"{name}: scale bytes {got}, expected {want}"
    del gen


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("small_tokens", [16, 32])
def test_edge_case_blocks_few_token_tile(dtype, small_tokens):
    """The special blocks (Inf, NaN, subnormal, ...) through the few-token tile, which
    handles 2 or 4 column tiles per thread: every block in every column tile and group."""
    torch.manual_seed(2)
    blocks = torch.stack([edge_block_tensor(name, dtype).float()[0] for name in EDGE_BLOCK_NAMES])
    n = blocks.shape[0]
    perm = torch.stack([torch.randperm(32) for _ in range(16 * n)]).view(16 * n, 32)
    tiled = blocks.repeat(16, 1).gather(1, perm).view(16, n, 32).permute(1, 0, 2).reshape(n, 512)
    source = tiled.to(dtype).cuda()
    for start in range(0, n, 13):  # at most 13 rows: one few-token launch each
        chunk = source[start : start + 13]
        _check_against_reference(chunk, 1024, 512, small_tokens=small_tokens)
        _check_many_with_padding(
            [chunk, chunk.flip(1).contiguous()], [512, 0], 1024, 128, small_tokens=small_tokens
        )


# --- CUDA Graphs, the custom ops, the public API ------------------------------------------


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_cuda_graph_capture_and_replay(dtype):
    from mxfp8_fusion.kernels import quantize_slice as kernel
    from mxfp8_fusion.kernels.launcher import _launchers

    gen = torch.Generator(device="cuda").manual_seed(3)
    static = _wide_range(200, 1024, dtype, "cuda", gen)
    values, scales = _poisoned(256, 2048, "cuda")
    kernel.run(static, values, scales, 1024)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel.run(static, values, scales, 1024)
    # every launcher took the one-ctypes-call path, not the DSL's generic call
    assert all(launcher._entry is not None for launcher in _launchers.values())
    for seed in (4, 5):
        gen.manual_seed(seed)
        static.copy_(_wide_range(200, 1024, dtype, "cuda", gen))
        graph.replay()
        want_v, want_s = _poisoned(256, 2048, "cuda")
        reference.quantize_slice_(static, want_v, want_s, 1024)
        torch.cuda.synchronize()
        assert torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
        assert torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))


@pytest.mark.gpu
@requires_sm90
def test_programmatic_launch_reads_only_after_the_previous_kernel():
    """Launches use programmatic dependent launch: each lets the next kernel's CTAs start
    early. The next one must still read nothing before this one has finished. Here the
    second launch's source is the destination the first launch writes, viewed as BF16, so
    an early read would see the poison."""
    from mxfp8_fusion.kernels import quantize_slice as kernel

    gen = torch.Generator(device="cuda").manual_seed(11)
    for _ in range(3):
        first = torch.randn(4096, 8192, dtype=torch.bfloat16, device="cuda", generator=gen)
        values, scales = _poisoned(4096, 8192, "cuda")
        chained = values.view(torch.bfloat16)  # [4096, 4096]
        values2, scales2 = _poisoned(4096, 4096, "cuda")
        kernel.run(first, values, scales, 0)
        kernel.run(chained, values2, scales2, 0)
        want_v, want_s = _poisoned(4096, 8192, "cuda")
        reference.quantize_slice_(first, want_v, want_s, 0)
        want_v2, want_s2 = _poisoned(4096, 4096, "cuda")
        reference.quantize_slice_(want_v.view(torch.bfloat16), want_v2, want_s2, 0)
        assert torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
        assert torch.equal(values2.view(torch.uint8), want_v2.view(torch.uint8))
        assert torch.equal(scales2.view(torch.uint8), want_s2.view(torch.uint8))


def _count_kernel_runs(monkeypatch) -> list[int]:
    from mxfp8_fusion.kernels import quantize_slice as kernel

    calls = []
    real = kernel.run_if_supported

    def counting(*args, **kwargs):
        launched = real(*args, **kwargs)
        if launched:
            calls.append(1)
        return launched

    monkeypatch.setattr(kernel, "run_if_supported", counting)
    return calls


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_public_quantize_uses_the_kernel(dtype, monkeypatch):
    import mxfp8_fusion

    calls = _count_kernel_runs(monkeypatch)
    gen = torch.Generator(device="cuda").manual_seed(9)
    x = _wide_range(300, 1024, dtype, "cuda", gen)
    got = mxfp8_fusion.quantize(x)
    want_v, want_s = reference.quantize(x)
    assert calls, "mxfp8_fusion.quantize did not run the CuTe kernel"
    assert torch.equal(got.values.view(torch.uint8), want_v.view(torch.uint8))
    assert torch.equal(got.scales.view(torch.uint8), want_s.view(torch.uint8))


@pytest.mark.gpu
@requires_sm90
def test_slice_op_uses_the_kernel(monkeypatch):
    calls = _count_kernel_runs(monkeypatch)
    gen = torch.Generator(device="cuda").manual_seed(10)
    source = _wide_range(129, 1024, torch.bfloat16, "cuda", gen)
    values, scales = _poisoned(256, 2048, "cuda")
    want_v, want_s = _poisoned(256, 2048, "cuda")
    torch.ops.mxfp8.quantize_slice_(source, values, scales, 1024)
    reference.quantize_slice_(source, want_v, want_s, 1024)
    assert calls, "mxfp8::quantize_slice_ did not run the CuTe kernel"
    assert torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))
