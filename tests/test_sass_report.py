"""`kpool-cupy ptx --sass`: static counts read off the SASS that ptxas and nvdisasm make of NVRTC's PTX."""

from __future__ import annotations

import dataclasses
import os
import stat
import sys

import pytest
from click.testing import CliRunner

from kpool_cupy.cli import main
from kpool_cupy.tools import sass
from kpool_cupy.tools.sass import SassSummary, find_tool, parse_sass
from kpool_cupy.tools.sass_report import tensor_core_count

# nvdisasm -c's layout, cut down. In program order: a branch before the first
# load (not in the softmax span), the first load (scalar, an index read), a
# BSSY before any 16-byte load (not in the span either: it starts at the first
# 16-byte load, a pool's first member), two 16-byte loads and an LDGSTS (global to shared, not an LDG)
# before the first exp, three more branch-like instructions before the last
# exp (a predicated backward BRA, BSYNC and a predicated BRA to itself, which
# is a real spin loop and so counts), a 16-byte load after the first
# exp, a MUFU.RCP that is not an exp, a BRA after the last exp, one 16-byte and
# one 4-byte store, and the end: EXIT, the unpredicated BRA to itself, NOPs.
SNIPPET = """\
\t.target\tsm_90

\t.elftype\t@"ET_EXEC"


//--------------------- .text.kernel --------------------------
\t.section\t.text.kernel,"ax",@progbits
\t.align\t128
kernel:
.text.kernel:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/               @P3 BRA `(.L_x_2) ;
        /*0020*/                   LDG.E.CONSTANT R7, desc[UR8][R6.64] ;
        /*0030*/                   BSSY B0, `(.L_x_1) ;
.L_x_0:
        /*0040*/                   LDG.E.128.CONSTANT R8, desc[UR8][R2.64] ;
        /*0050*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR8][R4.64] ;
        /*0060*/                   LDG.E.128 R12, desc[UR8][R4.64] ;
        /*0070*/               @P0 MUFU.EX2 R16, R8 ;
        /*0080*/              @!P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0090*/                   BSYNC B0 ;
        /*00a0*/                   LDG.E.128.CONSTANT R20, desc[UR8][R2.64+0x10] ;
.L_x_5:
        /*00b0*/               @P2 BRA `(.L_x_5) ;
        /*00c0*/                   MUFU.RCP R17, R17 ;
        /*00d0*/                   MUFU.EX2 R18, R9 ;
        /*00e0*/                   BRA `(.L_x_2) ;
.L_x_2:
        /*00f0*/                   STG.E.128 desc[UR8][R2.64], R16 ;
        /*0100*/                   STG.E desc[UR8][R2.64+0x10], R7 ;
        /*0110*/                   EXIT ;
.L_x_3:
        /*0120*/                   BRA `(.L_x_3);
        /*0130*/                   NOP;
        /*0140*/                   NOP;
        /*0150*/                   NOP;
.L_x_4:


//--------------------- SYMBOLS --------------------------
"""
# 0x0000..0x0110 is 18 instructions; the BRA at 0x0120 and the NOPs are padding.
SNIPPET_COUNTS = sass.SassCounts(
    instructions=18,
    vector_loads=3,
    vector_stores=1,
    vector_loads_before_first_exp=2,
    branches_in_softmax=3,
    exps=2,
)


def test_parse_sass_counts_a_known_snippet():
    assert parse_sass(SNIPPET) == SNIPPET_COUNTS


def test_the_end_of_kernel_self_branch_by_address_and_with_encodings():
    # cuobjdump writes branch targets as addresses, nvdisasm -hex appends each
    # encoding to the line: the same code, the same counts.
    by_address = SNIPPET.replace("BRA `(.L_x_3);", "BRA 0x120;").replace(
        " ;\n", " ;                    /* 0x000fe20000000f00 */\n"
    )
    assert "BRA 0x120;" in by_address and "/* 0x000fe2" in by_address
    assert parse_sass(by_address) == SNIPPET_COUNTS


# After the body's EXIT, ptxas's out-of-line fallback of a shuffle in a warp it cannot prove converged: entered
# by a forward branch from the body, it branches back to where the body left off.
OUT_OF_LINE = SNIPPET.replace(
    """        /*0110*/                   EXIT ;
.L_x_3:""",
    """        /*0110*/                   EXIT ;
.L_x_6:
        /*0114*/                   WARPSYNC.COLLECTIVE R61, `(.L_x_7) ;
.L_x_7:
        /*0118*/                   BRA `(.L_x_1) ;
.L_x_3:""",
)


def test_loops_are_the_bodys_backward_branches_not_out_of_line_returns():
    # The snippet's loop: 0x40-0x80 (the predicated branch back; the spin at 0xb0 branches to itself). The
    # out-of-line code's branch back to 0x90 would span 0x90-0x118, two stores and the EXIT: no loop (the model
    # would count its body once a repeat; the spill and division checks would find loops that are not).
    instructions, labels = sass.parse_instructions(OUT_OF_LINE)
    assert 0x118 in [i.address for i in instructions]
    assert sass.loop_spans(instructions, labels) == [(0x40, 0x80)]


def test_without_an_exp_every_load_comes_before_it_and_no_branch_is_in_the_softmax():
    no_exp = SNIPPET.replace("MUFU.EX2", "MUFU.RCP")
    assert parse_sass(no_exp) == dataclasses.replace(
        SNIPPET_COUNTS, vector_loads_before_first_exp=3, branches_in_softmax=0, exps=0
    )


# wgmma (sm_90a) beside mma.sync: the shape's lower-case x is part of the opcode.
TENSOR_CORE_LINES = """\
        /*0100*/                   HMMA.16816.F32.BF16 R12, R4, R8, R12 ;
        /*0110*/                   QMMA.16832.F32.E4M3.E4M3 R88, R88.ROW, R44.COL, RZ ;
        /*0120*/                   HGMMA.64x16x16.F32.BF16 R24, R32, gdesc[UR8].tnspB, RZ, UP0, gsb0 ;
        /*0130*/               @P0 QGMMA.64x16x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
        /*0140*/                   IMMA.16832.S8.S8 R4, R8, R12, R4 ;
        /*0150*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
"""


def test_a_wgmma_opcode_parses_whole():
    code, _ = sass.parse_instructions(TENSOR_CORE_LINES)
    assert code[3].opcode == ("QGMMA", "64x16x32", "F32", "E4M3", "E4M3"), code[3]
    assert code[3].guard == "P0" and code[3].operands.strip() == "R24, gdesc[UR4], RZ, !UPT, gsb0"
    assert code[2].opcode == ("HGMMA", "64x16x16", "F32", "BF16"), code[2]
    assert code[5].opcode == ("WARPGROUP", "DEPBAR", "LE") and code[5].operands.strip() == "gsb0, 0x0"


def test_the_tensor_core_count_takes_warp_and_warpgroup_mmas():
    # HMMA and QMMA (mma.sync) as before, HGMMA and QGMMA (wgmma) too; IMMA (integers) is no op's.
    assert tensor_core_count(TENSOR_CORE_LINES) == 4
    assert tensor_core_count(SNIPPET) == 0


def _tools_or_skip() -> None:
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="the SASS starts from NVRTC's PTX")
    for tool in ("ptxas", "nvdisasm"):
        try:
            find_tool(tool)
        except RuntimeError as error:
            pytest.skip(str(error))


def test_a_real_compile_of_the_bf16_128_4_compress_variant():
    # Structure only: the kernel is being reworked, and its performance
    # numbers belong to the tests of that work.
    _tools_or_skip()
    summary = sass.summarize_compress_sass(128, 4, "bfloat16", arch="compute_90")
    assert summary.registers > 0, summary.registers
    assert summary.instructions > 100, summary.instructions
    # Four members, each with a 16-byte k and gate load at the least.
    assert summary.vector_loads >= 8, summary.vector_loads
    assert "MUFU.EX2" in summary.sass and ".target\tsm_90" in summary.sass
    assert summary.exps == summary.sass.count("MUFU.EX2"), summary.exps


def test_find_tool_prefers_the_wheel_to_path_and_says_what_to_install(tmp_path, monkeypatch):
    wheel_bin, on_path = tmp_path / "wheel", tmp_path / "path"
    for folder in (wheel_bin, on_path):
        folder.mkdir()
        tool = folder / "ptxas"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sass, "_wheel_bin_folders", lambda: [wheel_bin])
    monkeypatch.setenv("PATH", str(on_path))
    assert find_tool("ptxas") == str(wheel_bin / "ptxas")
    # No wheel: the one on PATH.
    monkeypatch.setattr(sass, "_wheel_bin_folders", lambda: [])
    assert find_tool("ptxas") == str(on_path / "ptxas")
    # Neither: an error naming the extra and the wheel.
    monkeypatch.setenv("PATH", os.devnull)
    with pytest.raises(RuntimeError, match=r"ptxas on PATH.*nvidia-cuda-nvcc"):
        find_tool("ptxas")


# Every count different, so a number printed on the wrong line shows.
FAKE = SassSummary(
    registers=61,
    spill_stores=8,
    spill_loads=12,
    instructions=701,
    vector_loads=24,
    vector_stores=3,
    vector_loads_before_first_exp=9,
    branches_in_softmax=5,
    exps=40,
    sass=SNIPPET,
)


@pytest.fixture
def fake_summary(monkeypatch):
    calls = []

    def summarize(source, name, arch):
        calls.append((source, name, arch))
        return FAKE

    monkeypatch.setattr(sass, "summarize_sass", summarize)
    return calls


@pytest.mark.parametrize(
    ("op", "header"),
    [
        ("compress", "kpool_compress float16, head_dim 64, kpool 4, sm_90 SASS"),
        ("hadamard_quant_fp8", "kpool_hadamard_quant_fp8 float16, head_dim 64, sm_90 SASS"),
        ("index_logits_fp8", "kpool_index_logits_fp8, head_dim 64, sm_90 SASS"),
        ("index_topk", "kpool_index_topk, pool_topk up to 512, sm_90 SASS"),
        ("expand_topk", "kpool_expand_topk, kpool 4, sm_90 SASS"),
    ],
)
def test_the_report_header_names_what_the_kernel_is_built_for(op, header, fake_summary):
    # It printed --dtype for the indexer's ops and expand, whose kernels take no element type.
    result = CliRunner().invoke(main, ["ptx", "--sass", "--op", op, "--dtype", "float16", "--head-dim", "64"])
    assert result.exit_code == 0 and result.output.splitlines()[0] == header, result.output


def test_ptx_sass_prints_each_count_on_its_line(fake_summary):
    result = CliRunner().invoke(main, ["ptx", "--sass", "--head-dim", "64", "--kpool", "8", "--arch", "compute_90"])
    assert result.exit_code == 0, result.output
    # compute_90 asks for sm_90's machine code.
    from kpool_cupy.tools.variants import op_variant

    kernel, name = op_variant("compress", 64, 8, "bfloat16")
    assert fake_summary == [(kernel.source, name, "sm_90")]
    lines = {line[:42].strip(): line[42:].strip() for line in result.output.splitlines()[1:]}
    assert lines == {
        "registers": "61",
        "spill stores/loads": "8 / 12 bytes",
        "16-byte loads": "24",
        "16-byte stores": "3",
        "16-byte loads before the first exp": "9",
        "branches, first 16-byte load to last exp": "5",
        "static instructions": "701",
        "exps (MUFU.EX2)": "40",
        # 61 registers (64 allocated) x 8 warps of a 256-thread block: 4 blocks fill the 65,536 registers.
        "blocks per SM (256-thread blocks)": "4",
        # The snippet's scalar load feeds no other load's address, but the 16-byte load after the first exp
        # (0x00a0) issues after that MUFU.EX2 read the load at 0x0040: in order, a second round trip.
        "load round trips (in order, longest path)": "2",
    }, result.output


def test_ptx_sass_out_writes_the_sass(fake_summary, tmp_path):
    out = tmp_path / "kernel.sass"
    result = CliRunner().invoke(main, ["ptx", "--sass", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text() == SNIPPET and f"SASS written to {out}" in result.output


def test_ptx_sass_out_writes_real_sass_not_ptx(tmp_path):
    _tools_or_skip()
    out = tmp_path / "kernel.sass"
    result = CliRunner().invoke(main, ["ptx", "--sass", "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "/*0000*/" in text and "MUFU.EX2" in text and ".version" not in text


def test_ptx_sass_without_the_tools_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(sass, "_wheel_bin_folders", lambda: [])
    monkeypatch.setenv("PATH", os.devnull)
    monkeypatch.setattr(sass, "kernel_ptx", lambda *a: pytest.fail("compiled before finding the tools"))
    result = CliRunner().invoke(main, ["ptx", "--sass"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    lines = result.output.splitlines()
    assert len(lines) == 1, result.output
    # Every missing piece in one line (a user installed them one error at a time), NVRTC's too where it lacks.
    assert lines[0].startswith("Error: ptxas not found: put a CUDA 13 toolkit's ptxas on PATH"), lines
    assert "; nvdisasm not found: pip install 'kpool-cupy[sass]'" in lines[0], lines
    # The ptxas wheel's CUDA 13 headers shadow CuPy for CUDA 12's own: the hint says so (a hostile round).
    assert "install it beside kpool-cupy[cuda13] only" in lines[0], lines


def test_ptx_sass_names_nvrtc_with_the_other_missing_tools(monkeypatch):
    monkeypatch.setattr(sass, "_wheel_bin_folders", lambda: [])
    monkeypatch.setenv("PATH", os.devnull)
    libs = pytest.importorskip("cupy_backends.cuda.libs")
    monkeypatch.delattr(libs, "nvrtc", raising=False)
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs.nvrtc", None)  # importing it raises ImportError
    monkeypatch.setattr(sass, "kernel_ptx", lambda *a: pytest.fail("compiled before finding the tools"))
    result = CliRunner().invoke(main, ["ptx", "--sass"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: compiling needs CuPy's NVRTC bindings: install kpool-cupy[cuda12]")
    assert "; ptxas not found" in result.output and "; nvdisasm not found" in result.output


@pytest.mark.parametrize("arch", ["hopper", "sm_90x", "compute_90b", "sm_90aa", "sm90"])
@pytest.mark.parametrize("flags", [["--sass"], []], ids=["sass", "ptx"])
def test_a_bad_arch_is_a_usage_error_before_any_work(flags, arch, fake_summary):
    # NVRTC's architectures take no suffix but 'a' (arch-specific) and 'f' (family-specific); any other letter
    # is a usage error here, not NVRTC's log after a compile.
    result = CliRunner().invoke(main, ["ptx", *flags, "--arch", arch])
    assert result.exit_code == 2 and "'--arch'" in result.output and f"'{arch}'" in result.output, result.output
    assert "'sm_NNf'" in result.output, result.output
    assert fake_summary == []


def test_copy_stages_are_two_more_than_the_groups_a_wait_leaves_in_flight():
    # An LDGSTS ring whose steady wait leaves one group pending and whose last waits for all: 3 stages. No
    # LDGSTS: no pipeline, whatever DEPBAR says (a scoreboard wait on something else); nor without a wait.
    from kpool_cupy.tools.sass_report import copy_stages

    lines = [
        "        /*0000*/                   LDGSTS.E.BYPASS.128 [R4], desc[UR8][R6.64] ;",
        "        /*0010*/                   LDGDEPBAR ;",
        "        /*0020*/                   DEPBAR.LE SB0, 0x1 ;",
        "        /*0030*/                   DEPBAR.LE SB0, 0x0 ;",
        "        /*0040*/                   EXIT ;",
    ]
    assert copy_stages("\n".join(lines)) == 3
    assert copy_stages("\n".join(lines[1:])) is None
    assert copy_stages("\n".join(lines[:2] + lines[4:])) is None  # copies no wait reads: no pipeline to read
