"""torch.library.opcheck for every mxfp8:: custom op (schema, fake impl, dispatch)."""

import pytest
import torch

from mxfp8_fusion import format as fmt
from mxfp8_fusion import ops, reference


def _operands(m=40, k=256, n=128, dtype=torch.bfloat16):
    x = torch.randn(m, k).to(dtype)
    a_values, a_scales = reference.quantize(x)
    b_values, b_scales = reference.quantize(torch.randn(n, k).to(dtype))
    return x, a_values, a_scales.view(torch.uint8), b_values, b_scales.view(torch.uint8)


def _cases():
    x, av, asc, bv, bsc = _operands()
    bias = torch.randn(128, dtype=torch.bfloat16)
    values = torch.empty(64, 512, dtype=fmt.VALUE_DTYPE)
    scales = torch.empty(fmt.scale_bytes(64, 512), dtype=torch.uint8)
    out = torch.empty(50, 128, dtype=torch.bfloat16)
    return [
        (ops.quantize, (x,)),
        (ops.quantize_slice_, (x, values, scales, 128)),
        (
            ops.quantize_slice_,
            (torch.randn(8, 512, dtype=torch.float16)[:, 128:384], values, scales, 256),
        ),
        (ops.mm, (av, asc, bv, bsc, None, torch.bfloat16)),
        (ops.mm, (av, asc, bv, bsc, bias, torch.float16)),
        (ops.mm_into, (av, asc, bv, bsc, bias, out)),
        (ops.linear, (x, bv, bsc, None)),
        (ops.linear, (x.half(), bv, bsc, bias)),
    ]


@pytest.mark.parametrize("op,args", _cases(), ids=lambda v: getattr(v, "_name", None))
def test_opcheck(op, args):
    utils = list(torch.library._OPCHECK_DEFAULT_UTILS)
    if any(isinstance(a, torch.Tensor) and a.dtype == fmt.VALUE_DTYPE for a in args):
        # opcheck's schema test compares tensors with torch.allclose, which CPU torch does not
        # implement for float8_e4m3fn; test_inputs_not_declared_mutable_are_untouched checks
        # the same contract bitwise.
        utils.remove("test_schema")
    torch.library.opcheck(op, args, test_utils=utils)


@pytest.mark.parametrize("op,args", _cases(), ids=lambda v: getattr(v, "_name", None))
def test_inputs_not_declared_mutable_are_untouched(op, args):
    mutable = {a.name for a in op._schema.arguments if a.is_write}
    names = [a.name for a in op._schema.arguments]
    before = {
        name: a.clone()
        for name, a in zip(names, args, strict=False)
        if isinstance(a, torch.Tensor) and name not in mutable
    }
    op(*args)
    for name, saved in before.items():
        now = args[names.index(name)]
        assert torch.equal(now.view(torch.uint8), saved.view(torch.uint8)), name


def test_mutating_ops_write_only_what_they_own():
    _, av, asc, bv, bsc = _operands(m=40)
    out = torch.full((64, 128), 5.0, dtype=torch.bfloat16)
    ops.mm_into(av, asc, bv, bsc, None, out)
    assert (out[40:] == 5.0).all()
    assert torch.equal(out[:40], ops.mm(av, asc, bv, bsc, None, torch.bfloat16))


def test_multi_slice_op_equals_one_op_per_slice():
    sources = [torch.randn(9, w, dtype=torch.bfloat16) for w in (256, 128, 128)]
    wide = torch.randn(9, 1024, dtype=torch.bfloat16)
    sources.append(wide[:, 384:640])  # a strided view
    columns = [0, 256, 384, 512]
    one = (
        torch.empty(16, 768, dtype=fmt.VALUE_DTYPE),
        torch.empty(fmt.scale_bytes(16, 768), dtype=torch.uint8),
    )
    many = (one[0].clone(), one[1].clone())
    for source, column in zip(sources, columns, strict=True):
        ops.quantize_slice_(source, *one, column)
    ops.quantize_slices_(sources, *many, columns)
    assert torch.equal(one[0].view(torch.uint8), many[0].view(torch.uint8))
    assert torch.equal(one[1], many[1])
    torch.library.opcheck(
        ops.quantize_slices_,
        (sources, *many, columns),
        test_utils=["test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"],
    )


def test_eager_calls_skip_the_dispatcher_only_when_nothing_needs_it():
    """``ops.call`` runs an op's body directly for plain inference calls (a module's
    Parameter bias included) and goes through the dispatcher for anything autograd records
    or a tensor subclass must see."""
    plain = torch.zeros(4)
    frozen = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
    trained = torch.nn.Parameter(torch.zeros(4))

    class Subclass(torch.Tensor):
        pass

    sub = plain.as_subclass(Subclass)
    with torch.no_grad():
        assert not ops._needs_dispatcher((plain, [plain, plain], frozen, trained, 3, None))
        assert ops._needs_dispatcher((plain, [plain, sub]))
    assert not ops._needs_dispatcher((plain, frozen))
    assert ops._needs_dispatcher((plain, trained))
    assert ops._needs_dispatcher(([plain, trained],))
