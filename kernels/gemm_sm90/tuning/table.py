"""The measured GEMM table (``table.json`` beside this file): data the tuner writes, read here.

Each table holds what one tune measured on one device with one toolchain and one activation
(W8A8 tables have no ``activation`` key; a W8A16 tune's table says ``"bf16"``): per weight shape
(N, K) and measured token count, the fastest schedule that matched the reference (its
fields, as ``select.config_of`` reads them) and what it measured (its label in the receipt,
its time, its ratio to cuBLAS BF16's time). It is keyed by the device's name, its SM count
and the toolchain that measured it: a call on another device (an H100 SXM has the H200's
132 SMs) finds no table and takes the heuristic. On the measured device, a table measured
with the toolchain in use is taken first, else that device's latest one.

Regenerate on the GPU with

    python benchmarks/gemm.py --tune --rounds 5 --out benchmarks/results/gemm_tune.json --write-table kernels/gemm_sm90/tuning/table.json
"""

from __future__ import annotations

import functools
import json
from importlib import metadata
from pathlib import Path

from ....format import Activation

PATH = Path(__file__).with_name("table.json")
TOOLCHAIN_PACKAGE = "nvidia-cutlass-dsl"
"""The package whose version keys a table (the kernels' compiler)."""
MEASURED_DEVICE = "NVIDIA H200"
"""The device the committed table was measured on; what the tools and tests model by
default (:func:`select.choose_config`)."""


@functools.cache
def tables() -> tuple[dict, ...]:
    """Every table in ``table.json``, in the order written (latest last)."""
    return tuple(json.loads(PATH.read_text())["tables"])


@functools.cache
def _toolchain() -> str | None:
    try:
        return metadata.version(TOOLCHAIN_PACKAGE)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def shapes(
    device: str | None, num_sms: int, activation: Activation = Activation.W8A8
) -> dict[tuple[int, int], tuple]:
    """``{(N, K): ((measured tokens, schedule fields), ...)}`` of the table for ``device``
    (its name as CUDA reports it) with ``num_sms`` SMs, measured with ``activation`` (a
    table without the key: ``"mxfp8"``, W8A8); empty where none was measured."""
    found = [
        t
        for t in tables()
        if t["device"] == device
        and t["sms"] == num_sms
        and Activation.of(t.get("activation", Activation.W8A8)) is Activation.of(activation)
    ]
    same = [t for t in found if t["toolchain"].get(TOOLCHAIN_PACKAGE) == _toolchain()]
    if not (same or found):
        return {}
    table = (same or found)[-1]
    return {
        (s["n"], s["k"]): tuple((row["tokens"], row["schedule"]) for row in s["rows"])
        for s in table["shapes"]
    }


def measured_shapes() -> list[tuple[int, int]]:
    """Every weight shape (N, K) some table holds."""
    return list(dict.fromkeys((s["n"], s["k"]) for t in tables() for s in t["shapes"]))


def dumps(document: dict) -> str:
    """``document`` (``{"about": ..., "tables": [...]}``) as ``table.json`` holds it: one
    line per measured row."""
    lines = ["{", f' "about": {json.dumps(document["about"])},', ' "tables": [']
    for i, table in enumerate(document["tables"]):
        head = {key: value for key, value in table.items() if key != "shapes"}
        lines.append("  {")
        lines += [f"   {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
        lines.append('   "shapes": [')
        for j, shape in enumerate(table["shapes"]):
            lines.append(f'    {{"n": {shape["n"]}, "k": {shape["k"]}, "rows": [')
            rows = [f"     {json.dumps(row)}" for row in shape["rows"]]
            lines.append(",\n".join(rows))
            lines.append("    ]}" + ("," if j < len(table["shapes"]) - 1 else ""))
        lines.append("   ]")
        lines.append("  }" + ("," if i < len(document["tables"]) - 1 else ""))
    lines += [" ]", "}"]
    return "\n".join(lines) + "\n"
