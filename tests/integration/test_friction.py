"""Small things a user meets first: the version, the notices during long waits, no stray
warnings from the package's own calls."""

import importlib.metadata
import logging
import os
import subprocess
import sys
import textwrap

import pytest

import mxfp8_fusion as mf
from mxfp8_fusion import progress


def test_version_is_the_installed_distributions():
    assert mf.__version__ == importlib.metadata.version("mxfp8_fusion")


def test_notice_prints_where_logging_is_not_configured_and_logs_where_it_is(
    monkeypatch, capsys, caplog
):
    monkeypatch.setattr(progress, "_said", set())
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    progress.notice("building a kernel", once="k")
    progress.notice("building a kernel", once="k")  # once per key
    assert capsys.readouterr().err == "mxfp8_fusion: building a kernel\n"
    monkeypatch.undo()
    with caplog.at_level(logging.INFO, logger="mxfp8_fusion"):
        progress.notice("compiling")
    assert [r.getMessage() for r in caplog.records] == ["compiling"]
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_first_compile_prints_nothing_and_explain_warns_nothing():
    """In a fresh interpreter without logging set up: nothing on stderr for the first
    compile (an INFO record, which logging drops there, as it drops torch's), and no warning
    from explain's own settings (such as Dynamo's "dynamo_pgo force disabled")."""
    script = textwrap.dedent(
        """
        import warnings
        import torch
        import mxfp8_fusion as mf

        class Cat(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(256, 64, dtype=torch.bfloat16)

            def forward(self, a, b):
                return self.fc(torch.cat([a, b], -1))

        model = mf.convert(Cat())
        xs = [torch.randn(8, 128, dtype=torch.bfloat16) for _ in range(2)]
        warnings.simplefilter("error", UserWarning)
        with torch.no_grad():
            torch.compile(model, backend="mxfp8_fusion")(*xs)
            torch.compile(model, backend="mxfp8_fusion")(*xs)
            print(mf.explain(model, *xs).rewritten != [])
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "True"
    assert [line for line in run.stderr.splitlines() if line.strip()] == []


def test_first_compile_is_an_info_record(monkeypatch, caplog, capsys):
    """Shown where logging asks for INFO from ``mxfp8_fusion``, once per process; never a
    print."""
    import torch
    from helpers.passes import linear, slices

    from mxfp8_fusion.passes import backend

    monkeypatch.setattr(backend, "_compiled", [False])
    model = torch.nn.Sequential(linear(128))
    with caplog.at_level(logging.INFO, logger="mxfp8_fusion"), torch.no_grad():
        for _ in range(2):
            torch._dynamo.reset()
            torch.compile(model, backend="mxfp8_fusion")(*slices((128,)))
    said = [r for r in caplog.records if "compiling with Inductor" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert "compiling with Inductor" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_kernel_build_says_so(tmp_path):
    """A CuTe DSL compile takes seconds: one line says which kernel is being built (here the
    quantizer for sm_90a, compiled on the CPU); a second process reads it from the kernel
    cache and says nothing."""
    script = textwrap.dedent(
        """
        from mxfp8_fusion.kernels.runtime import launcher
        from mxfp8_fusion.kernels.quantize import host as kernel
        launcher.function(kernel.build_of(kernel.config_of(False, 1024, 1, "sm_90a")))
        """
    )
    env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a", "MXFP8_FUSION_CACHE_DIR": str(tmp_path)}
    said = []
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env
        )
        assert run.returncode == 0, run.stderr[-3000:]
        said.append([line for line in run.stderr.splitlines() if line.startswith("mxfp8_fusion:")])
    assert len(said[0]) == 1 and said[1] == []
    assert said[0][0].startswith("mxfp8_fusion: compiling a kernel, quantizer QuantizerConfig(")
    assert said[0][0].endswith("for sm_90a (seconds; kept on disk for the next process)")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mxfp8_fusion", *args], capture_output=True, text=True
    )


def test_version_names_what_it_runs_with_and_a_bare_call_prints_the_help():
    import torch

    run = _cli("--version")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"mxfp8_fusion {mf.__version__} | torch {torch.__version__} |")
    assert "nvidia-cutlass-dsl" in run.stdout and "| GPU: " in run.stdout
    bare = _cli()
    assert bare.returncode == 0 and bare.stdout.startswith("usage: python -m mxfp8_fusion")
    assert "demo" in bare.stdout and "warmup" in bare.stdout


def test_the_pass_names_still_import_from_mxfp8_fusion_passes():
    """``mxfp8_fusion.passes`` has no ``__init__.py``: the names it once exported are served
    from their modules; an unknown one says where the public names are."""
    import mxfp8_fusion.passes as passes
    from mxfp8_fusion.passes import FusionPass, FusionSkippedWarning, install
    from mxfp8_fusion.passes import fusion as fusion_module

    assert FusionPass is mf.FusionPass and FusionSkippedWarning is mf.FusionSkippedWarning
    assert install is fusion_module.install
    with pytest.raises(AttributeError, match=r"mxfp8_fusion\.FusionPass.*passes\.fusion"):
        passes.NoSuchName  # noqa: B018
