"""What `kpool-cupy ptx --sass` reads off a variant's machine code, without a GPU.

    NVRTC (CuPy's bindings) -> PTX -> CUDA 13 ptxas -arch=sm_NN -v -> cubin -> CUDA 13 nvdisasm -c -> SASS

The cubin comes from ptxas, not from NVRTC: CUDA 13's nvdisasm refuses NVRTC
12.9's cubin as an invalid ELF, while ptxas 13 reads NVRTC 12.9's PTX.
"""

from __future__ import annotations

import bisect
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path

from ..kernel.declarations import COMPRESS
from ..kernel.nvrtc import arch_number, code_ptx, compress_instance, kernel_ptx, parse_ptxas_log, require_nvrtc

# The wheel that carries each tool, as nvidia/cu13/bin/<tool> under site-packages.
WHEELS = {"ptxas": "nvidia-cuda-nvcc", "nvdisasm": "nvidia-cuda-nvdisasm"}
TIMEOUT_S = 120

# One instruction as nvdisasm prints it, predicate optional, encoding (-hex) optional:
#         /*0040*/              @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;        /* 0x0000000402047981 */
# A modifier may hold lower-case letters (a wgmma's shape: QGMMA.64x16x32.F32.E4M3.E4M3); the opcode ends at
# the space before the operands.
_INSTRUCTION = re.compile(
    r"^\s*/\*([0-9a-fA-F]+)\*/\s+(@!?U?P(?:T|\d+)\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)([^;]*);?"
    r"\s*(?:/\*[^*]*\*/)?\s*$"
)
# A label: a branch target (.L_x_2) or a subroutine ($__internal_0_$__cuda_sm20_div_s64).
_LABEL = re.compile(r"^\s*((?:\.L|\$)[\w$]+):\s*$")
# A branch or call target: nvdisasm's label, `(.L_x_2), or an address, 0x2bb0, as cuobjdump writes it.
_TARGET = re.compile(r"`\(((?:\.L|\$)[\w$]+)\)|\b0x([0-9a-fA-F]+)\b")
# Opcodes that change or reconverge the flow of a warp. EXIT is left out: a
# thread that leaves costs the others no detour.
# BSSY is not among them: it only records where a branch reconverges, and ptxas hoists it above code that does
# not branch (kp::store8's NaN test sets one up before a pool's exps); the branch itself is a BRA.
BRANCHES = frozenset({"BRA", "BSYNC", "WARPSYNC", "CALL", "BRX", "JMP"})


@dataclass(frozen=True)
class SassCounts:
    instructions: int
    vector_loads: int
    vector_stores: int
    vector_loads_before_first_exp: int
    branches_in_softmax: int
    exps: int


@dataclass(frozen=True)
class SassSummary(SassCounts):
    """A kernel's SASS counts with ptxas's register and spill report, and the SASS itself."""

    registers: int
    spill_stores: int
    spill_loads: int
    sass: str
    shared_bytes: int = 0  # static shared memory a block


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: its address, its guard predicate ("P0", "!UP1"; "" for none), its opcode split at
    the dots and its operand text."""

    address: int
    guard: str
    opcode: tuple[str, ...]  # "LDG.E.128.CONSTANT" as ("LDG", "E", "128", "CONSTANT")
    operands: str

    @property
    def predicated(self) -> bool:
        return bool(self.guard)


def branch_target(instruction: Instruction, labels: dict[str, int]) -> int | None:
    """The address a BRA, CALL or RET names (an nvdisasm label or an address), None when it names none."""
    target = _TARGET.search(instruction.operands)
    if target is None:
        return None
    return labels.get(target.group(1)) if target.group(1) else int(target.group(2), 16)


def _instructions(text: str) -> list[Instruction]:
    return parse_instructions(text)[0]


def parse_instructions(text: str) -> tuple[list[Instruction], dict[str, int]]:
    """The instructions of ``text`` in program order, without NOP padding and the end-of-kernel self-branch,
    and the address of each label.

    ptxas pads a kernel to a 128-byte boundary with NOPs and puts an
    unpredicated ``BRA`` to itself after the last EXIT, so that a warp that ran
    past the end spins instead of executing whatever follows. No correct warp
    issues either, so neither is counted. Any unpredicated BRA to itself is
    such a trap: as code it would be an endless loop.
    """
    found: list[Instruction] = []
    labels: dict[str, int] = {}
    pending: list[str] = []
    for line in text.splitlines():
        label = _LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        address = int(match.group(1), 16)
        labels.update(dict.fromkeys(pending, address))
        pending.clear()
        guard = (match.group(2) or "").strip().removeprefix("@")
        found.append(Instruction(address, guard, tuple(match.group(3).split(".")), match.group(4)))

    def self_branch(instruction: Instruction) -> bool:
        if instruction.opcode[0] != "BRA" or instruction.predicated:
            return False
        return branch_target(instruction, labels) == instruction.address

    kept = [i for i in found if i.opcode[0] != "NOP" and not self_branch(i)]
    # A label on a NOP (ptxas puts one where a CALL.REL.NOINC jumps) names the next instruction kept.
    addresses = [i.address for i in kept]
    for name, address in labels.items():
        goes_on = next_kept(addresses, address)
        labels[name] = address if goes_on is None else goes_on
    return kept, labels


def next_kept(addresses: list[int], address: int) -> int | None:
    """Where a branch to ``address`` goes on among the kept instructions' ``addresses`` (ascending): the first at
    or after it (a dropped NOP does nothing); None past the last."""
    at = bisect.bisect_left(addresses, address)
    return addresses[at] if at < len(addresses) else None


def loop_spans(instructions: list[Instruction], labels: dict[str, int]) -> list[tuple[int, int]]:
    """Each backward branch's [target, branch] address range: the loops' bodies.

    A branch after the body's last unpredicated EXIT is no loop's: ptxas puts
    code out of line there (a warp shuffle's fallback for a warp it cannot
    prove converged) and branches back to where the body left off, a span
    that would cover most of the kernel.
    """
    exits = [i.address for i in instructions if i.opcode[0] == "EXIT" and not i.predicated]
    body_end = max(exits) if exits else max((i.address for i in instructions), default=0)
    spans = []
    for instruction in instructions:
        target = branch_target(instruction, labels) if instruction.opcode[0] == "BRA" else None
        if target is not None and target < instruction.address <= body_end:
            spans.append((target, instruction.address))
    return spans


def innermost_loops(
    instructions: list[Instruction], labels: dict[str, int], opcodes: Collection[str]
) -> list[tuple[int, int]]:
    """The loops (``loop_spans``) that hold an instruction whose opcode is one of ``opcodes`` and hold no other
    such loop, in address order: the scorer's and the fused select's loops over a token's tiles of 16 heads, for
    the tensor-core opcodes."""
    at = [i.address for i in instructions if i.opcode[0] in opcodes]
    spans = [s for s in loop_spans(instructions, labels) if any(s[0] <= a <= s[1] for a in at)]
    return sorted(s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans))


def parse_sass(text: str) -> SassCounts:
    """Static counts of nvdisasm's SASS ``text``, one kernel's worth.

        vector_loads                   LDG with .128 (16 bytes a thread): LDG.E.128, LDG.E.128.CONSTANT
        vector_loads_before_first_exp  those of them before the first MUFU.EX2 (all of them without one)
        branches_in_softmax            BRA, BSYNC, WARPSYNC, CALL, BRX, JMP strictly between
                                       the first 16-byte LDG (a pool's first member load; the
                                       request search before it loops) and the last MUFU.EX2
                                       (0 without either)

    Counts are of the text, not of a run: a loop's body counts once, however
    many times it runs, and a predicated instruction counts whether or not its
    predicate holds. Program order is address order. Only LDG is a global
    load here: LDGSTS (global to shared) is not.
    """
    instructions = _instructions(text)

    def vector(instruction: Instruction, base: str) -> bool:
        return instruction.opcode[0] == base and "128" in instruction.opcode[1:]

    exps = [n for n, i in enumerate(instructions) if i.opcode[:2] == ("MUFU", "EX2")]
    loads = [n for n, i in enumerate(instructions) if vector(i, "LDG")]
    first_exp = exps[0] if exps else len(instructions)
    between = instructions[loads[0] + 1 : exps[-1]] if exps and loads else []
    return SassCounts(
        instructions=len(instructions),
        vector_loads=sum(vector(i, "LDG") for i in instructions),
        vector_stores=sum(vector(i, "STG") for i in instructions),
        vector_loads_before_first_exp=sum(vector(i, "LDG") for i in instructions[:first_exp]),
        branches_in_softmax=sum(i.opcode[0] in BRANCHES for i in between),
        exps=len(exps),
    )


def sm_arch(arch: str) -> str:
    """'sm_NN' for an 'sm_NN' or 'compute_NN' ``arch``: ptxas assembles for a real GPU only."""
    return f"sm_{arch_number(arch)}"


def _wheel_bin_folders() -> list[Path]:
    """nvidia/cu13/bin under each site-packages holding the ``nvidia`` namespace package; nothing is imported."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(location, "cu13", "bin") for location in spec.submodule_search_locations]


def find_tool(tool: str) -> str:
    """Path of ``tool`` ("ptxas" or "nvdisasm"): the CUDA 13 wheel's copy, else the one on PATH.

    The wheel's comes first because its major version is pinned; one on PATH
    may be older than the PTX NVRTC writes.
    """
    for folder in _wheel_bin_folders():
        candidate = folder / tool
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which(tool)
    if on_path is None:
        if tool == "ptxas":
            hint = (
                "put a CUDA 13 toolkit's ptxas on PATH (the wheel nvidia-cuda-nvcc>=13,<14 has one, but its CUDA 13 "
                "runtime headers come first for CuPy for CUDA 12: install it beside kpool-cupy[cuda13] only)"
            )
        else:
            hint = f"pip install 'kpool-cupy[sass]' (CUDA 13's {WHEELS[tool]} wheel) or put CUDA 13's {tool} on PATH"
        raise RuntimeError(f"{tool} not found: {hint}")
    return on_path


def check_tools() -> None:
    """What reading SASS needs (NVRTC, ptxas, nvdisasm), or one RuntimeError naming every piece missing, so
    a user installs them in one round."""
    missing = []
    for check in (require_nvrtc, lambda: find_tool("ptxas"), lambda: find_tool("nvdisasm")):
        try:
            check()
        except RuntimeError as error:
            missing.append(str(error))
    if missing:
        raise RuntimeError("; ".join(missing))


def _run(command: list[str], name: str) -> subprocess.CompletedProcess[str]:
    tool = Path(command[0]).name
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(f"{tool} ran over {TIMEOUT_S} s on {name}") from error
    except OSError as error:
        raise RuntimeError(f"could not run {command[0]}: {error}") from error
    if done.returncode != 0:
        raise RuntimeError(f"{tool} failed on {name} (exit {done.returncode}):\n{(done.stderr or done.stdout).strip()}")
    return done


def summarize_sass(source: str, name: str, arch: str = "sm_90") -> SassSummary:
    """Registers and spills (ptxas -v) and the static counts of `parse_sass` for kernel ``name`` of kernels/``source``.

    ``arch`` may be 'compute_NN': the SASS is for sm_NN all the same. NVRTC
    compiles the one name expression, so the cubin holds that kernel alone.
    Needs NVRTC, ptxas and nvdisasm (`find_tool`), no GPU and no driver.
    """
    check_tools()  # before compiling: a missing tool costs nothing
    return _summarize_ptx(kernel_ptx(source, name, sm_arch(arch)), name, sm_arch(arch))


def summarize_code_sass(code: str, name: str, arch: str = "sm_90") -> SassSummary:
    """`summarize_sass` of kernel ``name`` of a whole kernel text (a test's kernel, or another version of
    kernels/ inlined by ``kernel.sources``)."""
    check_tools()
    return _summarize_ptx(code_ptx(code, name, sm_arch(arch)), name, sm_arch(arch))


def _summarize_ptx(ptx: str, name: str, sm: str) -> SassSummary:
    ptxas, nvdisasm = find_tool("ptxas"), find_tool("nvdisasm")
    with tempfile.TemporaryDirectory(prefix="kpool-sass-") as folder:
        ptx_file, cubin = Path(folder, "kernel.ptx"), Path(folder, "kernel.cubin")
        ptx_file.write_text(ptx)
        assembled = _run([ptxas, f"-arch={sm}", "-v", str(ptx_file), "-o", str(cubin)], name)
        sass = _run([nvdisasm, "-c", str(cubin)], name).stdout
    report = parse_ptxas_log(assembled.stdout + assembled.stderr)
    registers = {"registers": report.registers, "spill_stores": report.spill_stores, "spill_loads": report.spill_loads}
    return SassSummary(**registers, **asdict(parse_sass(sass)), sass=sass, shared_bytes=report.shared_bytes)


def summarize_compress_sass(head_dim: int, kpool: int, dtype: str = "bfloat16", *, arch: str = "sm_90") -> SassSummary:
    """`summarize_sass` of the kpool_compress variant with k, gate and output of ``dtype``."""
    return summarize_sass(COMPRESS.source, compress_instance(head_dim, kpool, dtype), arch)
