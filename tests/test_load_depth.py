"""The global-load depth (kpool_cupy/tools/load_depth.py): on SASS written by hand, on SASS ptxas wrote for
sm_90a (cp.async, bulk and tensor copies, mbarriers, wgmma, warp roles), on kernels whose depth is known by
construction, on the decode step, which issue 21 brought from 4 dependent round trips to 2, and on the
scorer's sm_89 SASS, whose shuffles and loop exits are CALLs.

Hand-written SASS pins each rule of the definition (address, guard predicate, guarding branch, a store's
data, a loop's body once, a subroutine walked at each call; in-order issue; cp.async groups, mbarrier
waits, shared memory, roles) so that a rule that stopped counting fails here. Where in-order issue changes a dependence
rule's numbers, the test states both: ``in_order=False`` is the rule before it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from model import BF16

from kpool_cupy.kernel.codes import Fp8Target
from kpool_cupy.kernel.declarations import (
    INDEX_LOGITS_FP8,
    INDEX_VECTOR_CACHE,
    INDEX_VECTOR_Q,
    MMA_E4M3,
    TAIL_UPDATE,
    TAIL_UPDATE_FP8,
)
from kpool_cupy.kernel.sources import kernel_source
from kpool_cupy.tools import sass
from kpool_cupy.tools.load_depth import depth_before_first, load_depth, operands_of

ROOT = Path(__file__).resolve().parent.parent
BOTH = pytest.mark.parametrize("in_order", [False, True], ids=["dependence", "in-order"])


def _rules(dependence: list[int], in_order: list[int]):
    """Parametrize a test over the two rules with the depths each reads."""
    return pytest.mark.parametrize(
        ("in_order", "want"), [(False, dependence), (True, in_order)], ids=BOTH.kwargs["ids"]
    )


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


def _depths(*lines: str, in_order: bool = True) -> list[int]:
    result = load_depth(_sass(*lines), in_order=in_order)
    return [result.loads[a] for a in sorted(result.loads)]


# The dependence rules. In order, a load after an instruction that read loaded data is one deeper than that
# data even when its address needs none, so the fixtures whose last load is independent read deeper.


@_rules([1, 2, 1], [1, 2, 2])
def test_an_address_from_a_load_is_one_deeper(in_order, want):
    # The third load's address needs no load, but it issues after the IMAD.WIDE that waited for the first.
    assert (
        _depths(
            "LDG.E R4, desc[UR4][R2.64]",
            "IMAD.WIDE R6, R4, 0x4, R8",
            "LDG.E R10, desc[UR4][R6.64]",
            "LDG.E R11, desc[UR4][R8.64]",
            in_order=in_order,
        )
        == want
    )


@BOTH
def test_the_high_half_of_a_64_bit_operand_counts(in_order):
    # R9 is the upper half of IMAD.WIDE's 64-bit addend R8:R9.
    code = ("LDG.E R9, desc[UR4][R2.64]", "IMAD.WIDE R6, R5, 0x4, R8", "LDG.E R10, desc[UR4][R6.64]")
    assert _depths(*code, in_order=in_order) == [1, 2]


@BOTH
def test_a_guard_predicate_and_a_predicate_combined_from_it_count(in_order):
    assert _depths(
        "LDG.E R4, desc[UR4][R2.64]",
        "ISETP.GE.AND P1, PT, R4, RZ, PT",
        "PLOP3.LUT P0, PT, P1, PT, PT, 0x8, 0x0",
        "@P0 LDG.E R6, desc[UR4][R2.64+0x10]",
        in_order=in_order,
    ) == [1, 2]


@_rules([1, 2, 1], [1, 2, 2])
def test_a_branch_guards_its_side_until_the_paths_join(in_order, want):
    # After the join the last load is guarded by nothing, but the ISETP before the branch waited for the first.
    assert (
        _depths(
            "LDG.E R4, desc[UR4][R2.64]",
            "ISETP.GE.AND P0, PT, R4, RZ, PT",
            "@P0 BRA `(.L_x_1)",
            "LDG.E R6, desc[UR4][R2.64+0x10]",
            ".L_x_1:",
            "LDG.E R8, desc[UR4][R2.64+0x20]",
            "EXIT",
            in_order=in_order,
        )
        == want
    )


@BOTH
def test_a_predicated_exit_guards_everything_after_it(in_order):
    assert _depths(
        "LDG.E R4, desc[UR4][R2.64]",
        "ISETP.GE.AND P0, PT, R4, RZ, PT",
        "@P0 EXIT",
        "LDG.E R6, desc[UR4][R2.64+0x10]",
        "EXIT",
        in_order=in_order,
    ) == [1, 2]


@_rules([1, 2, 1], [1, 2, 2])
def test_a_load_follows_the_data_of_an_earlier_store_unless_it_is_read_only(in_order, want):
    # The read-only load need not follow the store, but in order it issues after the store waited for its data.
    assert (
        _depths(
            "LDG.E R4, desc[UR4][R2.64]",
            "STG.E desc[UR4][R6.64], R4",
            "LDG.E R8, desc[UR4][R10.64]",
            "LDG.E.CONSTANT R12, desc[UR4][R10.64+0x4]",
            in_order=in_order,
        )
        == want
    )


@BOTH
def test_a_loop_body_counts_once(in_order):
    # Each iteration's address comes from the last iteration's load, and the ISETP at the body's end waits for
    # it: the back edge is dropped, so neither makes the next iteration's load deeper.
    assert _depths(
        ".L_x_0:",
        "LDG.E R4, desc[UR4][R2.64]",
        "IMAD.WIDE R2, R4, 0x4, R2",
        "ISETP.NE.AND P0, PT, R4, RZ, PT",
        "@P0 BRA `(.L_x_0)",
        "EXIT",
        in_order=in_order,
    ) == [1]


# Subroutines: a CALL's target that reaches a RET is walked on the caller's path, at each CALL; one that
# reaches none is a jump. ptxas calls its 64-bit division and, on sm_89, its out-of-line shuffles, and leaves
# a loop under divergent flow by CALL.REL.NOINC to the code after it.


@BOTH
def test_a_load_in_a_subroutine_takes_its_depth_from_the_caller_and_gives_it_back(in_order):
    # The callee's address comes from the caller's first load (1), so its load is at 2, and the caller's last
    # load, addressed by the callee's result, at 3.
    assert _depths(
        "LDG.E R4, desc[UR4][R2.64]",
        "MOV R20, 0x30",
        "CALL.REL.NOINC `(.L_x_9)",
        "LDG.E R10, desc[UR4][R8.64]",
        "EXIT",
        ".L_x_9:",
        "IMAD.WIDE R6, R4, 0x4, R2",
        "LDG.E R8, desc[UR4][R6.64]",
        "RET.REL.NODEC R20 `(kernel)",
        in_order=in_order,
    ) == [1, 3, 2]


@_rules([1, 1], [1, 2])
def test_a_subroutine_issues_after_what_the_caller_waited_for(in_order, want):
    # The callee's address needs no load, but in order it issues after the ISETP that waited for the first.
    assert (
        _depths(
            "LDG.E R4, desc[UR4][R2.64]",
            "ISETP.GE.AND P0, PT, R4, RZ, PT",
            "CALL.REL.NOINC `($__internal_0_$__cuda_sm20_div_s64)",
            "EXIT",
            "$__internal_0_$__cuda_sm20_div_s64:",
            "LDG.E R8, desc[UR4][R2.64+0x10]",
            "RET.REL.NODEC R20 `(kernel)",
            in_order=in_order,
        )
        == want
    )


@_rules([1, 1], [1, 2])
def test_a_subroutine_result_carries_only_what_it_comes_from(in_order, want):
    # The callee makes R8 of the loaded R4 and R12:R13 of R2:R3: the load at R12 needs no load (a summary,
    # every result of every input, would put it at 2), but in order it issues after the IMAD.WIDE waited.
    assert (
        _depths(
            "LDG.E R4, desc[UR4][R2.64]",
            "CALL.REL.NOINC `($__internal_0_$__cuda_sm20_div_s64)",
            "LDG.E R10, desc[UR4][R12.64]",
            "EXIT",
            "$__internal_0_$__cuda_sm20_div_s64:",
            "IMAD.WIDE.U32 R8, R4, 0x4, RZ",
            "MOV R12, R2",
            "MOV R13, R3",
            "RET.REL.NODEC R20 `(kernel)",
            in_order=in_order,
        )
        == want
    )


@_rules([1, 3, 2, 2], [1, 3, 4, 3])
def test_a_subroutine_returns_to_the_call_that_entered_it(in_order, want):
    # Two calls of one callee, which loads at R6: at the first R6 is loaded (1), so the callee's load is at 2
    # and the load at its result at 3; at the second R6 needs no load, so they are at 1 and 2 (in order each
    # issues after what the warp waited for: 3 and 4). A RET that went back to both calls would make the
    # second call's result as deep as the first's. The callee's load counts at its deepest call.
    assert (
        _depths(
            "LDG.E R6, desc[UR4][R2.64]",
            "CALL.REL.NOINC `(.L_x_9)",
            "LDG.E R10, desc[UR4][R8.64]",
            "MOV R6, R2",
            "MOV R7, R3",
            "CALL.REL.NOINC `(.L_x_9)",
            "LDG.E R12, desc[UR4][R8.64]",
            "EXIT",
            ".L_x_9:",
            "LDG.E R8, desc[UR4][R6.64]",
            "RET.REL.NODEC R20 `(kernel)",
            in_order=in_order,
        )
        == want
    )


@BOTH
def test_a_call_that_never_returns_is_a_jump_out_of_the_loop(in_order):
    # sm_89's loop exit: the predicated CALL leaves the inner loop (the BRA after it is the back edge) for code
    # that reaches no RET, here the outer loop's tail, which branches back to the outer head: a jump, not a
    # call (a call would enter itself again). The tail's load comes after the loop's (1): at 2.
    assert _depths(
        ".L_x_0:",
        "LDG.E R4, desc[UR4][R2.64]",
        ".L_x_1:",
        "IMAD.WIDE R2, R4, 0x4, R2",
        "ISETP.NE.AND P0, PT, R4, RZ, PT",
        "@P0 CALL.REL.NOINC `(.L_x_2)",
        "BRA `(.L_x_1)",
        ".L_x_2:",
        "LDG.E R6, desc[UR4][R2.64]",
        "ISETP.NE.AND P1, PT, R6, RZ, PT",
        "@P1 BRA `(.L_x_0)",
        "EXIT",
        in_order=in_order,
    ) == [1, 2]


@BOTH
def test_a_jump_to_a_label_on_a_nop_goes_on_at_the_next_instruction(in_order):
    # ptxas for sm_80 puts a NOP under the label a predicated CALL.REL.NOINC jumps to; the parser drops NOPs, so
    # the label names the instruction after it (a CALL to the NOP's own address was "an unknown target").
    assert _depths(
        "LDG.E R4, desc[UR4][R2.64]",
        "ISETP.NE.AND P0, PT, R4, RZ, PT",
        "@P0 CALL.REL.NOINC `(.L_x_1)",
        "BRA `(.L_x_2)",
        ".L_x_1:",
        "NOP",
        "IMAD.WIDE R2, R4, 0x4, R2",
        ".L_x_2:",
        "LDG.E R6, desc[UR4][R2.64]",
        "EXIT",
        in_order=in_order,
    ) == [1, 2]


@BOTH
def test_a_branch_to_a_nops_address_goes_on_at_the_next_instruction(in_order):
    # A literal target (cuobjdump's form) on a NOP, which the parser drops: the BRA was taken for the kernel's
    # exit and the load after the NOP went missing (the hostile review of 2026-12-07).
    assert _depths(
        "LDG.E R4, desc[UR4][R2.64]",
        "IMAD.WIDE R2, R4, 0x4, R2",
        "BRA 0x40",
        "EXIT",
        "NOP",
        "LDG.E R6, desc[UR4][R2.64]",
        "EXIT",
        in_order=in_order,
    ) == [1, 2]


@BOTH
def test_an_unpredicated_jump_by_call_has_no_fall_through(in_order):
    # Nothing returns to the IMAD.WIDE after the CALL, so the second load's address needs no load.
    assert _depths(
        "LDG.E R4, desc[UR4][R2.64]",
        "CALL.REL.NOINC `(.L_x_1)",
        "IMAD.WIDE R2, R4, 0x4, R2",
        ".L_x_1:",
        "LDG.E R6, desc[UR4][R2.64]",
        "EXIT",
        in_order=in_order,
    ) == [1, 1]


@BOTH
def test_a_branch_taken_only_where_the_warp_diverged_falls_through_too(in_order):
    # BRA.DIV goes to a shuffle's slow path only in a diverged warp; the converged warp's SHFL passes the
    # first load (1) to the second's address. (The slow path here stands in with a value of no load.)
    assert _depths(
        "LDG.E R4, desc[UR4][R2.64]",
        "BRA.DIV ~URZ, `(.L_x_1)",
        "SHFL.IDX PT, R6, R4, RZ, 0x1f",
        ".L_x_2:",
        "IMAD.WIDE R8, R6, 0x4, R2",
        "LDG.E R10, desc[UR4][R8.64]",
        "EXIT",
        ".L_x_1:",
        "MOV R6, RZ",
        "BRA `(.L_x_2)",
        in_order=in_order,
    ) == [1, 2]


# In-order issue.


@_rules([1, 1, 1], [1, 1, 2])
def test_a_load_after_a_use_of_loaded_data_starts_a_new_round_trip(in_order, want):
    # The second load issues before anything waits and shares the first's trip; the third, whose address needs
    # no load, issues after the IADD3 that waited for the first.
    assert (
        _depths(
            "LDG.E R4, desc[UR4][R2.64]",
            "LDG.E R5, desc[UR4][R2.64+0x4]",
            "IADD3 R6, R4, 0x1, RZ",
            "LDG.E R8, desc[UR4][R10.64]",
            in_order=in_order,
        )
        == want
    )


@_rules([1, 1, 1], [1, 1, 2])
def test_an_instruction_waits_only_for_the_registers_it_reads_and_a_store_for_its_data(in_order, want):
    # The IADD3 reads no loaded register, so the second load shares the first's trip; the store of the
    # loaded value waits for it, so the read-only load after it (not ordered after the store) is one deeper.
    assert (
        _depths(
            "LDG.E R4, desc[UR4][R2.64]",
            "IADD3 R6, R7, 0x1, RZ",
            "LDG.E R8, desc[UR4][R10.64]",
            "STG.E desc[UR4][R12.64], R4",
            "LDG.E.CONSTANT R14, desc[UR4][R10.64+0x8]",
            in_order=in_order,
        )
        == want
    )


@_rules([1, 1], [1, 2])
def test_paths_join_at_the_deeper_wait(in_order, want):
    # Only one side of the branch waits for the load (the predicate needs none): after the join, the deeper.
    assert (
        _depths(
            "LDG.E R4, desc[UR4][R2.64]",
            "ISETP.NE.AND P0, PT, R7, RZ, PT",
            "@P0 BRA `(.L_x_1)",
            "IADD3 R6, R4, 0x1, RZ",
            ".L_x_1:",
            "LDG.E R8, desc[UR4][R10.64]",
            "EXIT",
            in_order=in_order,
        )
        == want
    )


# Asynchronous copies, shared memory and roles.


@_rules([1, 1, 2, 2, 1, 3], [1, 1, 2, 2, 3, 3])
def test_cp_async_groups_complete_oldest_first(in_order, want):
    # DEPBAR.LE SB0, 0x1 waits for every committed group but the newest: the first group (a copy at depth 1)
    # is in shared memory, the second (its address loaded: 2) may not be, so what the LDS reads is at 1 and
    # the load it addresses at 2. DEPBAR.LE SB0, 0x0 waits for the second: in order, every load after it is at 3.
    assert (
        _depths(
            "LDGSTS.E.BYPASS.128 [R20], desc[UR4][R6.64]",
            "LDGDEPBAR",
            "LDG.E R4, desc[UR4][R2.64]",
            "LDGSTS.E.BYPASS.128 [R21], desc[UR4][R4.64]",
            "LDGDEPBAR",
            "DEPBAR.LE SB0, 0x1",
            "LDS R8, [R22]",
            "LDG.E R10, desc[UR4][R8.64]",
            "DEPBAR.LE SB0, 0x0",
            "LDG.E R12, desc[UR4][R14.64]",
            "LDS R16, [R22]",
            "LDG.E R18, desc[UR4][R16.64]",
            in_order=in_order,
        )
        == want
    )


@BOTH
def test_cp_async_groups_line_up_from_the_newest_where_paths_join(in_order):
    # One side commits one group (its copy addressed by a load: 2), the other two (1 and 1). DEPBAR.LE SB0, 0x1
    # then leaves the newest group in flight on either side: the oldest on the second side (1) has arrived,
    # nothing on the first. Lined up from the oldest, the first side's group would count as arrived (2).
    assert _depths(
        "ISETP.NE.AND P0, PT, R7, RZ, PT",
        "@P0 BRA `(.L_x_1)",
        "LDG.E R4, desc[UR4][R2.64]",
        "LDGSTS.E.BYPASS.128 [R20], desc[UR4][R4.64]",
        "LDGDEPBAR",
        "BRA `(.L_x_2)",
        ".L_x_1:",
        "LDGSTS.E.BYPASS.128 [R20], desc[UR4][R6.64]",
        "LDGDEPBAR",
        "LDGSTS.E.BYPASS.128 [R21], desc[UR4][R8.64]",
        "LDGDEPBAR",
        ".L_x_2:",
        "DEPBAR.LE SB0, 0x1",
        "LDS R10, [R22]",
        "LDG.E R12, desc[UR4][R10.64]",
        "EXIT",
        in_order=in_order,
    ) == [1, 2, 1, 1, 2]


@BOTH
def test_a_read_of_shared_memory_waits_for_no_copy_in_flight(in_order):
    # Shared memory has no scoreboard: an LDS before the DEPBAR neither waits for the copy nor reads its data.
    assert _depths(
        "LDGSTS.E.BYPASS.128 [R20], desc[UR4][R6.64]",
        "LDGDEPBAR",
        "LDS R8, [R21]",
        "IADD3 R9, R8, 0x1, RZ",
        "LDG.E R10, desc[UR4][R9.64]",
        in_order=in_order,
    ) == [1, 1]


@_rules([1, 2, 3, 1], [1, 2, 3, 3])
def test_an_mbarrier_wait_consumes_the_copies_it_tracks(in_order, want):
    # cp.async.mbarrier.arrive (ARRIVES.LDGSTSBAR) hands the thread's LDGSTS to the mbarrier; the try_wait
    # (SYNCS.PHASECHK) consumes them: the shared data read after it is at 2, the load it addresses at 3.
    assert (
        _depths(
            "LDG.E R4, desc[UR4][R2.64]",
            "LDGSTS.E.128 [R20], desc[UR4][R4.64]",
            "ARRIVES.LDGSTSBAR.64.ARVCNT [UR7]",
            "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR7], R3",
            "LDS R6, [R21]",
            "LDG.E R8, desc[UR4][R6.64]",
            "LDG.E R10, desc[UR4][R12.64]",
            in_order=in_order,
        )
        == want
    )


@_rules([1, 2, 1], [1, 2, 2])
def test_a_bulk_store_writes_what_shared_memory_holds(in_order, want):
    # The loaded value goes to shared memory (STS) and from there to global memory (UBLKCP.G.S): an ordered
    # load follows that data, a read-only one does not (in order it follows the STS's wait).
    assert (
        _depths(
            "LDG.E R4, desc[UR4][R2.64]",
            "STS [R20], R4",
            "UBLKCP.G.S [UR8], [UR4], UR7",
            "LDG.E R8, desc[UR4][R10.64]",
            "LDG.E.CONSTANT R12, desc[UR4][R10.64+0x4]",
            in_order=in_order,
        )
        == want
    )


@BOTH
def test_a_wait_sees_what_another_role_arrived_with(in_order):
    # Lanes 0-31 load a value, store it to shared memory and arrive on an mbarrier; the others, on the other
    # side of the branch, wait on it, read the value back and load at it: one round trip after the producer's.
    assert _depths(
        "S2R R0, SR_TID.X",
        "ISETP.GE.U32.AND P0, PT, R0, 0x20, PT",
        "@P0 BRA `(.L_x_1)",
        "LDG.E R4, desc[UR4][R2.64]",
        "STS [R20], R4",
        "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR8], RZ",
        "EXIT",
        ".L_x_1:",
        "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR8], R3",
        "LDS R6, [R20]",
        "LDG.E R8, desc[UR4][R6.64]",
        "EXIT",
        in_order=in_order,
    ) == [1, 2]


@BOTH
def test_a_barrier_sees_what_another_role_arrived_with(in_order):
    # BARRIER_ROLES (compiled): warp 0's load (1) reaches warp 1 through shared memory and bar.arrive/bar.sync.
    result = load_depth(BARRIER_ROLES, in_order=in_order)
    assert result.loads == {0x160: 1, 0x100: 2}, result


@pytest.mark.parametrize(
    ("text", "depth", "first"),
    [
        # Three round trips, the third's value into mma.sync.
        pytest.param("CHAIN_THEN_MMA", 3, 3, id="chain-of-three"),
        # The page, then the cp.async it addresses; DEPBAR consumes the copy, which the LDS and HMMA read.
        pytest.param("PAGED_CP_ASYNC", 2, 2, id="cp.async"),
        # The row (read by thread 0 only), then two tensor copies at it: the try_wait after the paths join
        # consumes them, and the QGMMA reads them by descriptor.
        pytest.param("TMA_THEN_WGMMA", 2, 2, id="tma"),
        # The producer warp's request (1), page (2) and bulk copies (3); the consumer warpgroup's wait on the
        # other side of the branch consumes the copies, so its first QGMMA waits for three round trips.
        pytest.param("WARP_SPECIALISED", 3, 3, id="warp-specialised"),
    ],
)
@BOTH
def test_sm_90a_kernels_as_compiled(text, depth, first, in_order):
    code = globals()[text]  # by name: the SASS is at the end of this file
    assert load_depth(code, in_order=in_order).depth == depth
    assert depth_before_first(code, in_order=in_order) == first


def test_the_first_tensor_core_instruction_counts_and_later_loads_do_not():
    code = _sass(
        "LDG.E R4, desc[UR4][R2.64]",
        "HMMA.16816.F32 R8, R4, R4, RZ",
        "LDG.E R12, desc[UR4][R8.64]",
        "HMMA.16816.F32 R16, R12, R12, RZ",
        "EXIT",
    )
    assert load_depth(code).depth == 2 and depth_before_first(code) == 1
    assert depth_before_first(code, opcodes=("QGMMA", "HMMA")) == 1
    with pytest.raises(ValueError, match="tensor-core instruction"):
        depth_before_first(code, opcodes=("QGMMA",))


def _operands(line: str) -> tuple[list[str], list[str]]:
    (instruction,) = sass.parse_instructions(_sass(line))[0]
    return operands_of(instruction)


def test_operands_written_and_read():
    assert _operands("IADD3.X R5, R3, UR7, RZ, P5, !PT") == (["R5"], ["R3", "UR7", "P5"])
    assert _operands("SHFL.BFLY PT, R5, R4, 0x1, 0x1f") == (["R5"], ["R4"])
    assert _operands("STG.E.128 desc[UR8][R4.64], R16") == ([], ["UR8", "R4", "R5", "R16", "R17", "R18", "R19"])
    # The vote's input is its last operand (VOTEU.ALL UP0, P0 reads P0).
    assert _operands("VOTEU.ALL UP0, P0") == (["UP0"], ["P0"])
    assert _operands("VOTE.ANY R3, PT, P0") == (["R3"], ["P0"])


def _range(prefix: str, first: int, count: int) -> list[str]:
    return [f"{prefix}{first + i}" for i in range(count)]


def test_operands_of_the_tensor_cores():
    # m16n8k16, f32 accumulators: D and C 4 registers, A 4, B 2 (bf16); e4m3 m16n8k32 alike.
    assert _operands("HMMA.16816.F32.BF16 R12, R4, R8, R12") == (
        _range("R", 12, 4),
        _range("R", 4, 4) + _range("R", 8, 2) + _range("R", 12, 4),
    )
    assert _operands("QMMA.16832.F32.E4M3.E4M3 R12, R4, R8, RZ") == (
        _range("R", 12, 4),
        [*_range("R", 4, 4), "R8", "R9"],
    )
    # f16 accumulators are half as many: m16n8k16 two.
    assert _operands("HMMA.16816.F16 R12, R4, R8, RZ")[0] == ["R12", "R13"]
    # wgmma m64n16: 8 f32 accumulators a thread; two descriptors in UR4..UR7; !UPT does not accumulate.
    assert _operands("QGMMA.64x16x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ, !UPT, gsb0") == (
        _range("R", 24, 8),
        _range("UR", 4, 4),
    )
    # A from four registers; a scale-d predicate accumulates: D is read too.
    assert _operands("HGMMA.64x16x16.F32.BF16 R24, R32, gdesc[UR8].tnspB, RZ, UP0, gsb0") == (
        _range("R", 24, 8),
        _range("R", 32, 4) + _range("UR", 8, 4) + ["UP0"] + _range("R", 24, 8),
    )


def test_operands_of_the_copies_and_barriers():
    # UTMALDG.2D [UR8]: destination UR8, mbarrier UR9, coordinates UR10 and UR11; the tensor map UR14:UR15.
    assert _operands("UTMALDG.2D [UR8], [UR14]") == ([], [*_range("UR", 8, 4), "UR14", "UR15"])
    assert _operands("UTMALDG.5D [UR8], [UR18]") == ([], [*_range("UR", 8, 7), "UR18", "UR19"])
    assert _operands("UTMAPF.L2.2D [UR4], [UR6]") == ([], ["UR4", "UR5", "UR6", "UR7"])
    # UBLKCP.S.G [UR12]: destination and mbarrier; the 64-bit source; the bytes.
    assert _operands("UBLKCP.S.G [UR12], [UR4], UR8") == ([], ["UR12", "UR13", "UR4", "UR5", "UR8"])
    # LDGSTS writes shared memory, no register: [R7] is the destination's address; P0 the zero-fill predicate.
    assert _operands("LDGSTS.E [R7], desc[UR6][R4.64], P0") == ([], ["R7", "UR6", "R4", "R5", "P0"])
    assert _operands("LDSM.16.M88.4 R8, [R20]") == (_range("R", 8, 4), ["R20"])
    assert _operands("ARRIVES.LDGSTSBAR.64.ARVCNT [UR7]") == ([], ["UR7"])
    assert _operands("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R7+URZ], R3") == (["P0"], ["R7", "R3"])


def _test_kernel_sass(name: str) -> str:
    code = kernel_source("kpool_portability.h") + (ROOT / "tests/kernels/load_chains.cu").read_text()
    return sass.summarize_code_sass(code, name).sass


@pytest.mark.usefixtures("sass_tools")
def test_kernels_of_known_depth_read_back_as_built():
    # Pointer chasing: each load waits for the last in both rules.
    for n in (1, 3):
        text = _test_kernel_sass(f"chase<{n}>")
        assert load_depth(text).depth == load_depth(text, in_order=False).depth == n
    # The issue's own example: the decode step before it was at depth 4, each load waiting on the last.
    text = _test_kernel_sass("decode_step_before<8>")
    assert load_depth(text).depth == load_depth(text, in_order=False).depth == 4


@pytest.mark.usefixtures("sass_tools")
def test_the_scorer_on_sm_89_walks_its_calls():
    # ptxas for sm_89 calls its out-of-line shuffles (a RET goes back) and leaves the key walk's loops by
    # CALL.REL.NOINC to the code after them (no RET: a jump), and one of those regions loads. The first QMMA
    # waits on the staged request tree (1), a search step past its 512 requests (2), the lead request's pages
    # (3) and key rows (4), and, on the rare path of a tile's token of another request, that token's pages and
    # key rows, which the QMMA reads: 5 round trips by dependence, 7 in order. Since 2026-12-07 (no division
    # between a lane's page reads) ptxas issues each of that token's tiles' rows as soon as its page is
    # checked, before the later tiles' pages are read, so in order its last rows wait through two more trips;
    # until then both rules said 6, as the sm_90 build's (test_index_logits_fp8_sass) still do.
    name = INDEX_LOGITS_FP8.instance(HEAD_DIM=128, MMA=MMA_E4M3, VECTOR=INDEX_VECTOR_CACHE | INDEX_VECTOR_Q)
    text = sass.summarize_sass(INDEX_LOGITS_FP8.source, name, arch="sm_89").sass
    assert "CALL.REL.NOINC `($__internal" in text and "CALL.REL.NOINC `(.L_x_" in text  # both kinds
    for in_order, depth in ((False, 5), (True, 7)):
        assert depth_before_first(text, in_order=in_order) == depth, in_order
        assert load_depth(text, in_order=in_order).depth >= depth, in_order


def _decode_variant(kernel, **template) -> str:
    elements = {n: BF16 for n in ("T", "G", "OT") if n in {t.name for t in kernel.template}}
    return kernel.instance(**elements, HEAD_DIM=128, KPOOL=4, **template)


def decode_step_depths(target: Fp8Target | None) -> tuple[int, int]:
    """The decode step's (dependence, in-order) depths at most, as ptxas schedules it today.

    Dependence (issue 21): the slot, positions and token rows need only the request (1); the ring's members
    and an FP8 cache's slot or block-table entry need the slot and a position (2). In order (issue 35): step
    0's position and rows issue beside the slot and each later step's a step ahead, all kept as loaded until
    used (a sign extension right after a load is an instruction that waits for it): 2 for the plain and row
    writers (they were 3). An FP8 cache's slot or block-table entry (2) is loaded before the members and
    checked after them (kp::Fp8Sink::locate, then address): 2 (it was 4, then 3 while it was checked, and a
    64-bit division made of it, before the members issued).
    """
    return 2, 2


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("split", [False, True], ids=["one-array", "split"])
@pytest.mark.parametrize("target", [None, *Fp8Target], ids=lambda t: "plain" if t is None else t.name.lower())
def test_the_decode_step_waits_on_two_dependent_loads(target, split):
    # bf16, head_dim 128, kpool 4 (decode_step_depths says why each number).
    if target is None:
        kernel, name = TAIL_UPDATE, _decode_variant(TAIL_UPDATE, SPLIT=split)
    else:
        kernel, name = TAIL_UPDATE_FP8, _decode_variant(TAIL_UPDATE_FP8, SPLIT=split, TARGET=int(target))
    machine = sass.summarize_sass(kernel.source, name)
    dependence, in_order = decode_step_depths(target)
    assert load_depth(machine.sass, in_order=False).depth <= dependence, name
    assert load_depth(machine.sass).depth <= in_order, name
    assert machine.spill_stores == machine.spill_loads == 0, (name, machine.registers)


@pytest.mark.slow
@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize(("head_dim", "kpool"), [(64, 1), (64, 3), (256, 2), (256, 4)])
def test_the_decode_step_waits_on_two_dependent_loads_across_the_engines_shapes(head_dim, kpool):
    # 16-bit rows and pools of up to 4 members (where the token rows are issued before the positions).
    cases = ((TAIL_UPDATE, {"OT": BF16}, None), (TAIL_UPDATE_FP8, {"TARGET": int(Fp8Target.TABLE)}, Fp8Target.TABLE))
    for kernel, template, target in cases:
        name = kernel.instance(T=BF16, G=BF16, HEAD_DIM=head_dim, KPOOL=kpool, **template)
        machine = sass.summarize_sass(kernel.source, name)
        dependence, in_order = decode_step_depths(target)
        assert load_depth(machine.sass, in_order=False).depth <= dependence, name
        assert load_depth(machine.sass).depth <= in_order, name
        assert machine.spill_stores == 0, name


# Compiled for sm_90a (nvcc 13.0 -arch=sm_90a -O3 -cubin, nvdisasm -c; encodings, directives and NOP padding
# dropped).

# A chain of three loads, each address the last load's value, then mma.sync m16n8k16 on the third value.
CHAIN_THEN_MMA = """
    /*0000*/       LDC R1, c[0x0][0x28] ;
    /*0010*/       S2R R11, SR_TID.X ;
    /*0020*/       LDC.64 R6, c[0x0][0x210] ;
    /*0030*/       ULDC.64 UR4, c[0x0][0x208] ;
    /*0040*/       LDC.64 R8, c[0x0][0x218] ;
    /*0050*/       IMAD.WIDE R2, R11, 0x4, R6 ;
    /*0060*/       LDG.E.CONSTANT R3, desc[UR4][R2.64] ;
    /*0070*/       IMAD.WIDE R4, R3, 0x4, R6 ;
    /*0080*/       LDG.E.CONSTANT R5, desc[UR4][R4.64] ;
    /*0090*/       IMAD.WIDE R6, R5, 0x4, R6 ;
    /*00a0*/       LDG.E.CONSTANT R12, desc[UR4][R6.64] ;
    /*00b0*/       SHF.L.U32 R3, R11, 0x2, RZ ;
    /*00c0*/       IMAD.WIDE R2, R3, 0x4, R8 ;
    /*00d0*/       MOV R16, R12.reuse ;
    /*00e0*/       MOV R17, R12.reuse ;
    /*00f0*/       MOV R13, R12.reuse ;
    /*0100*/       MOV R14, R12.reuse ;
    /*0110*/       MOV R15, R12 ;
    /*0120*/       HMMA.16816.F32 R12, R12, R16, RZ ;
    /*0140*/       STG.E desc[UR4][R2.64], R12 ;
    /*0150*/       STG.E desc[UR4][R2.64+0x4], R13 ;
    /*0160*/       STG.E desc[UR4][R2.64+0x8], R14 ;
    /*0170*/       STG.E desc[UR4][R2.64+0xc], R15 ;
    .L_x_2:
    /*0180*/       EXIT ;
    .L_x_0:
    /*0190*/       BRA `(.L_x_0);
    .L_x_5:
"""

# The block's page (LDG) addresses a 16-byte cp.async of the keys (LDGSTS), committed and waited for
# (cp.async.wait_group 0: DEPBAR.LE SB0, 0x0); a neighbour's 16 bytes read back from shared memory feed
# mma.sync m16n8k16.
PAGED_CP_ASYNC = """
    /*0000*/       LDC R1, c[0x0][0x28] ;
    /*0010*/       S2R R5, SR_CTAID.X ;
    /*0020*/       LDC.64 R2, c[0x0][0x210] ;
    /*0030*/       ULDC.64 UR6, c[0x0][0x208] ;
    /*0040*/       S2R R13, SR_TID.X ;
    /*0050*/       S2UR UR5, SR_CgaCtaId ;
    /*0060*/       UMOV UR4, 0x400 ;
    /*0070*/       ULDC.64 UR8, c[0x0][0x218] ;
    /*0080*/       IMAD.WIDE.U32 R2, R5, 0x4, R2 ;
    /*0090*/       LDG.E.CONSTANT R2, desc[UR6][R2.64] ;
    /*00a0*/       ULEA UR4, UR5, UR4, 0x18 ;
    /*00b0*/       IMAD.SHL.U32 R0, R2, 0x80, RZ ;
    /*00c0*/       LDC.64 R2, c[0x0][0x220] ;
    /*00d0*/       SHF.R.S32.HI R4, RZ, 0x1f, R0 ;
    /*00e0*/       IADD3 R5, P0, R0, R13, RZ ;
    /*00f0*/       IMAD.SHL.U32 R0, R13, 0x10, RZ ;
    /*0100*/       LEA.HI.X.SX32 R6, R13, R4, 0x1, P0 ;
    /*0110*/       VIADD R7, R0.reuse, UR4 ;
    /*0120*/       LEA R4, P0, R5, UR8, 0x4 ;
    /*0130*/       IMAD.SHL.U32 R13, R13, 0x4, RZ ;
    /*0140*/       LOP3.LUT R0, R0, 0x10, RZ, 0x3c, !PT ;
    /*0150*/       LEA.HI.X R5, R5, UR9, R6, 0x4, P0 ;
    /*0160*/  @!PT LDS RZ, [RZ] ;
    /*0170*/  @!PT LDS RZ, [RZ] ;
    /*0180*/  @!PT LDS RZ, [RZ] ;
    /*0190*/       LDGSTS.E.BYPASS.128 [R7], desc[UR6][R4.64] ;
    /*01a0*/       LDGDEPBAR ;
    /*01b0*/       IMAD.WIDE R2, R13, 0x4, R2 ;
    /*01c0*/       DEPBAR.LE SB0, 0x0 ;
    /*01d0*/       LDS.128 R8, [R0+UR4] ;
    /*01e0*/       HMMA.16816.F32 R8, R8, R8, RZ ;
    /*0200*/       STG.E desc[UR6][R2.64], R8 ;
    /*0210*/       STG.E desc[UR6][R2.64+0x4], R9 ;
    /*0220*/       STG.E desc[UR6][R2.64+0x8], R10 ;
    /*0230*/       STG.E desc[UR6][R2.64+0xc], R11 ;
    .L_x_7:
    /*0240*/       EXIT ;
    .L_x_0:
    /*0250*/       BRA `(.L_x_0);
    .L_x_16:
"""

# Thread 0 reads a row (LDG), sets the mbarrier's expected bytes and issues two 2D tensor copies (UTMALDG) at
# that row; every thread waits on the mbarrier (try_wait.parity) and one e4m3 wgmma m64n16k32 (QGMMA) reads
# both tiles by descriptor.
TMA_THEN_WGMMA = """
    /*0000*/       LDC R1, c[0x0][0x28] ;
    /*0010*/       S2R R0, SR_TID.X ;
    /*0020*/       ULDC.64 UR12, c[0x0][0x208] ;
    /*0030*/       ISETP.NE.AND P0, PT, R0, RZ, PT ;
    /*0040*/  @!P0 S2R R5, SR_CTAID.X ;
    /*0050*/  @!P0 LDC.64 R2, c[0x0][0x300] ;
    /*0060*/  @!P0 IMAD.WIDE.U32 R2, R5, 0x4, R2 ;
    /*0070*/  @!P0 LDG.E.CONSTANT R2, desc[UR12][R2.64] ;
    /*0080*/       S2UR UR7, SR_CgaCtaId ;
    /*0090*/       UMOV UR6, 0x400 ;
    .L_x_61:
    /*00a0*/       VOTEU.ALL UP0, P0 ;
    /*00b0*/       UIADD3 UR4, UR6, 0xa00, URZ ;
    /*00c0*/       PLOP3.LUT P2, PT, P0, PT, PT, 0x8, 0x0 ;
    /*00d0*/       UMOV UR5, 0x1 ;
    .L_x_62:
    /*00e0*/       VOTEU.ALL UP1, P0 ;
    /*00f0*/  @!P0 LDC.64 R4, c[0x0][0x198] ;
    /*0100*/  @!P0 IMAD.MOV.U32 R3, RZ, RZ, 0xa00 ;
    /*0110*/       ULEA UR9, UR7, UR4, 0x18 ;
    /*0120*/       @!UP0 UIADD3 UR4, -UR5, 0x100000, URZ ;
    /*0130*/       @!UP0 USHF.L.U32 UR5, UR4, 0xb, URZ ;
    /*0140*/       @!UP0 USHF.L.U32 UR4, UR4, 0x1, URZ ;
    /*0150*/  @!P0 IADD3 R4, P1, R4, 0x70, RZ ;
    /*0160*/  @!P0 R2UR UR8, R4 ;
    /*0170*/  @!P0 IMAD.X R5, RZ, RZ, R5, P1 ;
    .L_x_65:
    /*0180*/       @!UP1 SYNCS.EXCH.64 URZ, [UR9], UR4 ;
    /*01a0*/       BAR.SYNC.DEFER_BLOCKING 0x0 ;
    /*01b0*/       PLOP3.LUT P1, PT, PT, PT, PT, 0x8, 0x0 ;
    /*01c0*/  @!P0 R2UR UR10, R5 ;
    .L_x_63:
    /*01d0*/       VOTEU.ALL UP1, P0 ;
    /*01e0*/       IMAD.U32 R4, RZ, RZ, UR8 ;
    /*01f0*/       @!UP0 ULEA UR8, UR7, UR6, 0x18 ;
    /*0200*/  @!P0 R2UR UR14, R4 ;
    /*0210*/       IMAD.U32 R5, RZ, RZ, UR10 ;
    /*0220*/       @!UP0 UMOV UR10, URZ ;
    /*0230*/  @!P0 R2UR UR15, R5 ;
    /*0240*/  @!P0 SYNCS.ARRIVE.TRANS64 RZ, [UR9], R3 ;
    /*0250*/  @!P0 R2UR UR11, R2 ;
    .L_x_28:
    /*0260*/   @P2 ELECT P1, URZ, PT ;
    /*0270*/       @!UP1 UTMALDG.2D [UR8], [UR14] ;
    /*0280*/   @P1 PLOP3.LUT P2, PT, P1, PT, PT, 0x8, 0x0 ;
    /*0290*/       PLOP3.LUT P1, PT, PT, PT, PT, 0x8, 0x0 ;
    /*02a0*/   @P2 BRA.U.ANY `(.L_x_28) ;
    /*02b0*/       @!UP0 UIADD3 UR4, UR6, 0x800, URZ ;
    /*02c0*/       PLOP3.LUT P1, PT, PT, PT, PT, 0x8, 0x0 ;
    .L_x_64:
    /*02d0*/       VOTEU.ALL UP1, P0 ;
    /*02e0*/       PLOP3.LUT P2, PT, P0, PT, PT, 0x8, 0x0 ;
    /*02f0*/       @!UP0 ULEA UR8, UR7, UR4, 0x18 ;
    /*0300*/       @!UP0 UMOV UR10, 0x20 ;
    .L_x_29:
    /*0310*/   @P2 ELECT P1, URZ, PT ;
    /*0320*/       @!UP1 UTMALDG.2D [UR8], [UR14] ;
    /*0330*/   @P1 PLOP3.LUT P2, PT, P1, PT, PT, 0x8, 0x0 ;
    /*0340*/       PLOP3.LUT P1, PT, PT, PT, PT, 0x8, 0x0 ;
    /*0350*/   @P2 BRA.U.ANY `(.L_x_29) ;
    /*0360*/       SHF.L.U32 R2, RZ, 0x1f, RZ ;
    .L_x_66:
    /*0370*/       SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9], R2 ;
    /*0380*/  @!P0 BRA `(.L_x_30) ;
    .L_x_31:
    /*0390*/       UIADD3 UR5, UR6, 0x800, URZ ;
    /*03a0*/       WARPGROUP.ARRIVE ;
    /*03b0*/       ULEA UR4, UR7, UR6, 0x18 ;
    /*03c0*/       LDC.64 R2, c[0x0][0x308] ;
    /*03d0*/       ULEA UR5, UR7, UR5, 0x18 ;
    /*03e0*/       IMAD.SHL.U32 R5, R0, 0x8, RZ ;
    /*03f0*/       USHF.R.U32.HI UR4, URZ, 0x4, UR4 ;
    /*0400*/       USHF.R.U32.HI UR5, URZ, 0x4, UR5 ;
    /*0410*/       ULOP3.LUT UR4, UR4, 0x10000, URZ, 0xfc, !UPT ;
    /*0420*/       ULOP3.LUT UR6, UR5, 0x10000, URZ, 0xfc, !UPT ;
    /*0430*/       UMOV UR7, 0x40 ;
    /*0440*/       UMOV UR5, 0x40 ;
    /*0450*/       QGMMA.64x16x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
    /*0460*/       IMAD.WIDE.U32 R2, R5, 0x4, R2 ;
    /*0470*/       WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
    /*0480*/       STG.E desc[UR12][R2.64], R24 ;
    /*0490*/       STG.E desc[UR12][R2.64+0x4], R25 ;
    /*04a0*/       STG.E desc[UR12][R2.64+0x8], R26 ;
    /*04b0*/       STG.E desc[UR12][R2.64+0xc], R27 ;
    /*04c0*/       STG.E desc[UR12][R2.64+0x10], R28 ;
    /*04d0*/       STG.E desc[UR12][R2.64+0x14], R29 ;
    /*04e0*/       STG.E desc[UR12][R2.64+0x18], R30 ;
    /*04f0*/       STG.E desc[UR12][R2.64+0x1c], R31 ;
    .L_x_68:
    /*0500*/       EXIT ;
    .L_x_30:
    /*0510*/       SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9], R2 ;
    /*0520*/  @!P0 BRA `(.L_x_30) ;
    /*0530*/       BRA `(.L_x_31) ;
    .L_x_32:
    /*0540*/       BRA `(.L_x_32);
    .L_x_71:
"""

# Warp-specialised, 160 threads: warp 4's lane 0 reads the request (LDG), its page (LDG), and bulk-copies the
# page's keys to shared memory on the full mbarrier (UBLKCP.S.G); warps 0-3 wait on that mbarrier and run one
# e4m3 wgmma (QGMMA). The producer and the consumer are the two sides of a branch on the warp index.
WARP_SPECIALISED = """
    /*0000*/       LDC R1, c[0x0][0x28] ;
    /*0010*/       S2R R5, SR_TID.X ;
    /*0020*/       UMOV UR4, 0x1 ;
    /*0030*/       ULDC.64 UR10, c[0x0][0x208] ;
    /*0040*/       ISETP.NE.AND P0, PT, R5, RZ, PT ;
    /*0050*/  @!P0 S2R R3, SR_CgaCtaId ;
    /*0060*/  @!P0 MOV R0, 0x400 ;
    .L_x_8:
    /*0070*/       VOTEU.ALL UP0, P0 ;
    /*0080*/  @!P0 VIADD R0, R0, 0xa00 ;
    /*0090*/       @!UP0 UIADD3 UR4, -UR4, 0x100000, URZ ;
    /*00a0*/       @!UP0 USHF.L.U32 UR5, UR4, 0xb, URZ ;
    /*00b0*/       @!UP0 USHF.L.U32 UR4, UR4, 0x1, URZ ;
    .L_x_9:
    /*00c0*/       VOTEU.ALL UP0, P0 ;
    /*00d0*/  @!P0 LEA R0, R3, R0, 0x18 ;
    /*00e0*/  @!P0 R2UR UR6, R0 ;
    /*00f0*/       LOP3.LUT R0, R5, 0xffffffe0, RZ, 0xc0, !PT ;
    /*0100*/       ISETP.NE.AND P1, PT, R0, 0x80, PT ;
    .L_x_10:
    /*0110*/       @!UP0 SYNCS.EXCH.64 URZ, [UR6], UR4 ;
    /*0130*/       BAR.SYNC.DEFER_BLOCKING 0x0 ;
    /*0140*/  @!P1 BRA `(.L_x_1) ;
    /*0150*/       S2R R3, SR_CgaCtaId ;
    /*0160*/       MOV R4, 0x400 ;
    /*0170*/       SHF.L.U32 R0, RZ, 0x1f, RZ ;
    /*0180*/       VIADD R2, R4, 0xa00 ;
    /*0190*/       LEA R7, R3, R2, 0x18 ;
    .L_x_11:
    /*01a0*/       SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R7+URZ], R0 ;
    /*01b0*/  @!P0 BRA `(.L_x_2) ;
    .L_x_5:
    /*01c0*/       VIADD R0, R4.reuse, 0x800 ;
    /*01d0*/       WARPSYNC.ALL ;
    /*01e0*/       R2UR UR4, R4 ;
    /*01f0*/       WARPGROUP.ARRIVE ;
    /*0200*/       R2UR UR5, R3 ;
    /*0210*/       IMAD.SHL.U32 R5, R5, 0x8, RZ ;
    /*0220*/       R2UR UR6, R0 ;
    /*0230*/       R2UR UR7, R3 ;
    /*0240*/       LDC.64 R2, c[0x0][0x228] ;
    /*0250*/       ULEA UR4, UR5, UR4, 0x18 ;
    /*0260*/       ULEA UR5, UR7, UR6, 0x18 ;
    /*0270*/       USHF.R.U32.HI UR4, URZ, 0x4, UR4 ;
    /*0280*/       USHF.R.U32.HI UR5, URZ, 0x4, UR5 ;
    /*0290*/       ULOP3.LUT UR4, UR4, 0x10000, URZ, 0xfc, !UPT ;
    /*02a0*/       ULOP3.LUT UR6, UR5, 0x10000, URZ, 0xfc, !UPT ;
    /*02b0*/       UMOV UR7, 0x40 ;
    /*02c0*/       UMOV UR5, 0x40 ;
    /*02d0*/       IMAD.WIDE.U32 R2, R5, 0x4, R2 ;
    /*02e0*/       QGMMA.64x16x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
    /*02f0*/       WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
    /*0300*/       STG.E desc[UR10][R2.64], R24 ;
    /*0310*/       STG.E desc[UR10][R2.64+0x4], R25 ;
    /*0320*/       STG.E desc[UR10][R2.64+0x8], R26 ;
    /*0330*/       STG.E desc[UR10][R2.64+0xc], R27 ;
    /*0340*/       STG.E desc[UR10][R2.64+0x10], R28 ;
    /*0350*/       STG.E desc[UR10][R2.64+0x14], R29 ;
    /*0360*/       STG.E desc[UR10][R2.64+0x18], R30 ;
    /*0370*/       STG.E desc[UR10][R2.64+0x1c], R31 ;
    .L_x_13:
    /*0380*/       EXIT ;
    .L_x_1:
    /*0390*/       LOP3.LUT P0, RZ, R5, 0x1f, RZ, 0xc0, !PT ;
    .L_x_14:
    /*03a0*/   @P0 EXIT ;
    /*03b0*/       S2R R5, SR_CTAID.X ;
    /*03c0*/       LDC.64 R2, c[0x0][0x210] ;
    /*03d0*/       IMAD.WIDE.U32 R2, R5, 0x4, R2 ;
    /*03e0*/       LDC.64 R4, c[0x0][0x218] ;
    /*03f0*/       LDG.E.CONSTANT R3, desc[UR10][R2.64] ;
    /*0400*/       S2UR UR7, SR_CgaCtaId ;
    /*0410*/       UMOV UR6, 0x400 ;
    /*0420*/       UIADD3 UR4, UR6, 0xa00, URZ ;
    /*0430*/       IMAD.WIDE R4, R3, 0x4, R4 ;
    /*0440*/       LDG.E.CONSTANT R4, desc[UR10][R4.64] ;
    /*0450*/       ULEA UR13, UR7, UR4, 0x18 ;
    /*0460*/       IMAD.MOV.U32 R0, RZ, RZ, 0xa00 ;
    /*0470*/       PLOP3.LUT P0, PT, PT, PT, PT, 0x80, 0x0 ;
    /*0480*/       ULDC.64 UR4, c[0x0][0x220] ;
    /*0490*/       ULEA UR12, UR7, UR6, 0x18 ;
    /*04a0*/       SYNCS.ARRIVE.TRANS64 RZ, [UR13], R0 ;
    /*04b0*/       R2UR UR8, R4 ;
    /*04c0*/       UIMAD.WIDE UR4, UR8, 0x1000, UR4 ;
    /*04d0*/       UMOV UR8, 0x80 ;
    .L_x_3:
    /*04e0*/   @P0 ELECT P1, URZ, PT ;
    /*04f0*/       UBLKCP.S.G [UR12], [UR4], UR8 ;
    /*0500*/   @P1 PLOP3.LUT P0, PT, P1, PT, PT, 0x8, 0x0 ;
    /*0510*/       PLOP3.LUT P1, PT, PT, PT, PT, 0x8, 0x0 ;
    /*0520*/   @P0 BRA.U.ANY `(.L_x_3) ;
    /*0530*/       UIADD3 UR4, UP0, UR4, 0x800, URZ ;
    /*0540*/       PLOP3.LUT P0, PT, PT, PT, PT, 0x80, 0x0 ;
    /*0550*/       UIADD3 UR6, UR6, 0x800, URZ ;
    /*0560*/       UIADD3.X UR5, URZ, UR5, URZ, UP0, !UPT ;
    /*0570*/       ULEA UR6, UR7, UR6, 0x18 ;
    /*0580*/       UMOV UR8, 0x20 ;
    .L_x_4:
    /*0590*/   @P0 ELECT P1, URZ, PT ;
    /*05a0*/       UMOV UR7, UR13 ;
    /*05b0*/       UBLKCP.S.G [UR6], [UR4], UR8 ;
    /*05c0*/   @P1 PLOP3.LUT P0, PT, P1, PT, PT, 0x8, 0x0 ;
    /*05d0*/       PLOP3.LUT P1, PT, PT, PT, PT, 0x8, 0x0 ;
    /*05e0*/   @P0 BRA.U.ANY `(.L_x_4) ;
    .L_x_15:
    /*05f0*/       EXIT ;
    .L_x_2:
    /*0600*/       YIELD ;
    .L_x_12:
    /*0610*/       SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R7+URZ], R0 ;
    /*0620*/  @!P0 BRA `(.L_x_2) ;
    /*0630*/       BRA `(.L_x_5) ;
    .L_x_6:
    /*0640*/       BRA `(.L_x_6);
    .L_x_17:
"""

# Named barrier 1 between roles: warp 0 loads a value, stores it to shared memory and arrives (bar.arrive: BAR.ARV);
# warp 1 waits (bar.sync: BAR.SYNC), reads it back and loads at the address it gives.
BARRIER_ROLES = """
    /*0000*/       LDC R1, c[0x0][0x28] ;
    /*0010*/       S2R R7, SR_TID.X ;
    /*0020*/       ULDC.64 UR6, c[0x0][0x208] ;
    /*0030*/       ISETP.GE.U32.AND P0, PT, R7, 0x20, PT ;
    /*0040*/  @!P0 BRA `(.L_x_0) ;
    /*0050*/       WARPSYNC.ALL ;
    /*0060*/       S2UR UR5, SR_CgaCtaId ;
    /*0070*/       BAR.SYNC.DEFER_BLOCKING 0x1, 0x40 ;
    /*0080*/       SHF.L.U32 R0, R7, 0x2, RZ ;
    /*0090*/       LOP3.LUT R0, R0, 0x7c, RZ, 0xc0, !PT ;
    /*00a0*/       UMOV UR4, 0x400 ;
    /*00b0*/       LDC.64 R2, c[0x0][0x210] ;
    /*00c0*/       ULEA UR4, UR5, UR4, 0x18 ;
    /*00d0*/       LDS R5, [R0+UR4] ;
    /*00e0*/       IMAD.WIDE R2, R5, 0x4, R2 ;
    /*00f0*/       LDC.64 R4, c[0x0][0x218] ;
    /*0100*/       LDG.E.CONSTANT R3, desc[UR6][R2.64] ;
    /*0110*/       IMAD.WIDE.U32 R4, R7, 0x4, R4 ;
    /*0120*/       STG.E desc[UR6][R4.64], R3 ;
    .L_x_2:
    /*0130*/       EXIT ;
    .L_x_0:
    /*0140*/       LDC.64 R2, c[0x0][0x210] ;
    /*0150*/       IMAD.WIDE.U32 R2, R7, 0x4, R2 ;
    /*0160*/       LDG.E.CONSTANT R2, desc[UR6][R2.64] ;
    /*0170*/       S2UR UR5, SR_CgaCtaId ;
    /*0180*/       UMOV UR4, 0x400 ;
    /*0190*/       ULEA UR4, UR5, UR4, 0x18 ;
    /*01a0*/       LEA R5, R7, UR4, 0x2 ;
    /*01b0*/       WARPSYNC.ALL ;
    /*01c0*/       STS [R5], R2 ;
    /*01d0*/       BAR.ARV 0x1, 0x40 ;
    .L_x_3:
    /*01e0*/       EXIT ;
    .L_x_1:
    /*01f0*/       BRA `(.L_x_1);
    .L_x_4:
"""
