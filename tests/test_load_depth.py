"""The dependent global-load depth (kpool_cupy/tools/load_depth.py): on SASS written by hand, on kernels whose
depth is known by construction, and on the decode step, which issue 21 brings from 4 round trips to 2.

Hand-written SASS pins each rule of the definition (address, guard predicate, guarding branch, a store's
data, a loop's body once, a subroutine's summary) so that a rule that stopped counting fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from model import BF16

from kpool_cupy.kernel.codes import Fp8Target
from kpool_cupy.kernel.declarations import TAIL_UPDATE, TAIL_UPDATE_FP8
from kpool_cupy.kernel.sources import kernel_source
from kpool_cupy.tools import sass
from kpool_cupy.tools.load_depth import load_depth, operands_of

ROOT = Path(__file__).resolve().parent.parent


def _sass(*lines: str) -> str:
    """nvdisasm-style text: each instruction at the next 16-byte address, labels (ending in ':') as given."""
    text, address = [], 0
    for line in lines:
        if line.endswith(":"):
            text.append(line)
            continue
        text.append(f"        /*{address:04x}*/                   {line} ;")
        address += 0x10
    return "\n".join(text)


def _depths(*lines: str) -> list[int]:
    result = load_depth(_sass(*lines))
    return [result.loads[a] for a in sorted(result.loads)]


def test_an_address_from_a_load_is_one_deeper():
    assert _depths(
        "LDG.E R4, desc[UR4][R2.64]",
        "IMAD.WIDE R6, R4, 0x4, R8",
        "LDG.E R10, desc[UR4][R6.64]",
        "LDG.E R11, desc[UR4][R8.64]",
    ) == [1, 2, 1]


def test_the_high_half_of_a_64_bit_operand_counts():
    # R9 is the upper half of IMAD.WIDE's 64-bit addend R8:R9.
    assert _depths("LDG.E R9, desc[UR4][R2.64]", "IMAD.WIDE R6, R5, 0x4, R8", "LDG.E R10, desc[UR4][R6.64]") == [1, 2]


def test_a_guard_predicate_and_a_predicate_combined_from_it_count():
    assert _depths(
        "LDG.E R4, desc[UR4][R2.64]",
        "ISETP.GE.AND P1, PT, R4, RZ, PT",
        "PLOP3.LUT P0, PT, P1, PT, PT, 0x8, 0x0",
        "@P0 LDG.E R6, desc[UR4][R2.64+0x10]",
    ) == [1, 2]


def test_a_branch_guards_its_side_until_the_paths_join():
    assert _depths(
        "LDG.E R4, desc[UR4][R2.64]",
        "ISETP.GE.AND P0, PT, R4, RZ, PT",
        "@P0 BRA `(.L_x_1)",
        "LDG.E R6, desc[UR4][R2.64+0x10]",
        ".L_x_1:",
        "LDG.E R8, desc[UR4][R2.64+0x20]",
        "EXIT",
    ) == [1, 2, 1]


def test_a_predicated_exit_guards_everything_after_it():
    assert _depths(
        "LDG.E R4, desc[UR4][R2.64]",
        "ISETP.GE.AND P0, PT, R4, RZ, PT",
        "@P0 EXIT",
        "LDG.E R6, desc[UR4][R2.64+0x10]",
        "EXIT",
    ) == [1, 2]


def test_a_load_follows_the_data_of_an_earlier_store_unless_it_is_read_only():
    assert _depths(
        "LDG.E R4, desc[UR4][R2.64]",
        "STG.E desc[UR4][R6.64], R4",
        "LDG.E R8, desc[UR4][R10.64]",
        "LDG.E.CONSTANT R12, desc[UR4][R10.64+0x4]",
    ) == [1, 2, 1]


def test_a_loop_body_counts_once():
    # Each iteration's address comes from the last iteration's load: the back edge is dropped.
    assert _depths(
        ".L_x_0:",
        "LDG.E R4, desc[UR4][R2.64]",
        "IMAD.WIDE R2, R4, 0x4, R2",
        "ISETP.NE.AND P0, PT, R4, RZ, PT",
        "@P0 BRA `(.L_x_0)",
        "EXIT",
    ) == [1]


def test_a_call_passes_its_inputs_to_everything_the_callee_writes():
    assert _depths(
        "LDG.E R4, desc[UR4][R2.64]",
        "CALL.REL.NOINC `($__internal_0_$__cuda_sm20_div_s64)",
        "LDG.E R10, desc[UR4][R8.64]",
        "LDG.E R11, desc[UR4][R2.64+0x8]",
        "EXIT",
        "$__internal_0_$__cuda_sm20_div_s64:",
        "IMAD.WIDE.U32 R8, R4, 0x4, RZ",
        "RET.REL.NODEC R20 `(kernel)",
    ) == [1, 2, 1]


def test_operands_written_and_read():
    (instruction,) = sass.parse_instructions(_sass("IADD3.X R5, R3, UR7, RZ, P5, !PT"))[0]
    assert operands_of(instruction) == (["R5"], ["R3", "UR7", "P5"])
    (instruction,) = sass.parse_instructions(_sass("SHFL.BFLY PT, R5, R4, 0x1, 0x1f"))[0]
    assert operands_of(instruction) == (["R5"], ["R4"])
    (instruction,) = sass.parse_instructions(_sass("STG.E.128 desc[UR8][R4.64], R16"))[0]
    assert operands_of(instruction) == ([], ["UR8", "R4", "R5", "R16", "R17", "R18", "R19"])


def _test_kernel_depth(name: str) -> int:
    code = kernel_source("kpool_portability.h") + (ROOT / "tests/kernels/load_chains.cu").read_text()
    return load_depth(sass.summarize_code_sass(code, name).sass).depth


@pytest.mark.usefixtures("sass_tools")
def test_kernels_of_known_depth_read_back_as_built():
    assert [_test_kernel_depth(f"chase<{n}>") for n in (1, 3)] == [1, 3]
    # The issue's own example: the decode step before it was at depth 4.
    assert _test_kernel_depth("decode_step_before<8>") == 4


def _decode_variant(kernel, **template) -> str:
    elements = {n: BF16 for n in ("T", "G", "OT") if n in {t.name for t in kernel.template}}
    return kernel.instance(**elements, HEAD_DIM=128, KPOOL=4, **template)


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("split", [False, True], ids=["one-array", "split"])
@pytest.mark.parametrize("target", [None, *Fp8Target], ids=lambda t: "plain" if t is None else t.name.lower())
def test_the_decode_step_waits_on_two_loads_at_most(target, split):
    # bf16, head_dim 128, kpool 4: the slot, positions and tokens need only the request (1); the
    # ring's members and an FP8 cache's slot or block-table entry need the slot and position (2).
    if target is None:
        kernel, name = TAIL_UPDATE, _decode_variant(TAIL_UPDATE, SPLIT=split)
    else:
        kernel, name = TAIL_UPDATE_FP8, _decode_variant(TAIL_UPDATE_FP8, SPLIT=split, TARGET=int(target))
    machine = sass.summarize_sass(kernel.source, name)
    assert load_depth(machine.sass).depth <= 2, name
    assert machine.spill_stores == machine.spill_loads == 0, (name, machine.registers)


@pytest.mark.slow
@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize(("head_dim", "kpool"), [(64, 1), (64, 3), (256, 2), (256, 4)])
def test_the_decode_step_waits_on_two_loads_across_the_engines_shapes(head_dim, kpool):
    # 16-bit rows and pools of up to 4 members (where the token rows are issued before the positions).
    for kernel, template in ((TAIL_UPDATE, {"OT": BF16}), (TAIL_UPDATE_FP8, {"TARGET": int(Fp8Target.TABLE)})):
        name = kernel.instance(T=BF16, G=BF16, HEAD_DIM=head_dim, KPOOL=kpool, **template)
        machine = sass.summarize_sass(kernel.source, name)
        assert load_depth(machine.sass).depth <= 2, name
        assert machine.spill_stores == 0, name
