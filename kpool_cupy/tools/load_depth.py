"""The global-load depth of a kernel, read off its SASS: how many memory round trips a thread waits through,
one after another, before its last global load can issue.

    depth(load) = 1 + the deepest load data the warp has waited for when the load issues

A warp issues in order, and an instruction waits only for the registers it
reads (a store for the data it stores, a guarded instruction for its guard
too). So a global load is at depth d + 1 when the deepest loaded data that an
instruction before it on the path, itself included, had to read is at depth
d: its address, its guard predicate, the predicate of a branch that guards it,
the data of a store, or a value the load does not use at all. A load after no
such wait is at depth 1. The misreading to avoid: a load whose address needs
no load is not at depth 1 when it comes after an instruction that used loaded
data; it cannot issue before that data arrived, and starts a new round trip.

``in_order=False`` is the rule before in-order issue, dependence only: a load
is at d + 1 when its address, its guard predicate, a branch that guards it
(control dependence), or the data of a global store it must follow depends on
a load at depth d. In both rules read-only loads (LDG.*.CONSTANT: `const
__restrict__` data, which the kernel never writes) need not follow stores;
registers carry the largest depth of the loads their value comes from, merged
(max) where paths join, and a value computed under a branch carries the
branch's too, as a value chosen by the path would; data stored to shared
memory and read back carries its depth.

The depth of a kernel is the largest over its paths, a loop's body counted
once (back edges are dropped: an iteration that waits for the last one's data
is not counted again). A subroutine (a CALL's target that reaches a RET:
ptxas's 64-bit division, its out-of-line shuffles) is part of every path that
calls it, walked at each CALL: depth flows in through the registers it reads
and what the warp had waited for, and out through the registers it writes. A
CALL whose target reaches no RET is a jump (on sm_89 ptxas leaves a loop
under divergent flow by CALL.REL.NOINC to the code after it).

Asynchronous copies (sm_80's cp.async, sm_90's bulk and tensor copies) are
global loads whose data goes to shared memory, not to a register: LDGSTS,
waited for by DEPBAR.LE SB0, n (every committed group, LDGDEPBAR, but the
newest n) or, after ARRIVES.LDGSTSBAR, by an mbarrier; UBLKCP.S.G and UTMALDG,
waited for by an mbarrier (SYNCS.PHASECHK: try_wait, test_wait). A wait
consumes the copies it waits for, and their data is then in shared memory:
what LDS, LDSM, HGMMA and QGMMA (wgmma's operands, by descriptor) read from
shared memory carries the deepest of it and of the data stored there. A read
of shared memory waits for nothing (shared memory has no scoreboard; the wait
before it did), so it neither waits for nor reads a copy still in flight.

Roles: a kernel that branches on the warp index into a producer (loads) and
a consumer (MMA) runs them on paths that exclude each other. A wait on an
mbarrier (or BAR.SYNC) also consumes what is published on the blocks that are
neither before nor after it on any path, the other roles': their copies, and
at their arrivals (SYNCS.ARRIVE, ARRIVES.LDGSTSBAR; BAR) the data they had
waited for or stored to shared memory. One hand-off: the other roles count as
they run alone, so a consumer's wait sees its producer's chain, and the
producer's wait for a freed stage (the consumer's next iteration) counts
nothing, as a loop's next iteration counts nothing.

Approximations, each an upper bound: no address is compared, so a wait on one
mbarrier consumes every copy the path has in flight on any, and a role's wait
the deepest of everything the other roles publish (for a producer whose later
stages wait on its earlier ones, more than the first stage needs; exact when
each stage's chain is as deep as the first, as a pipeline that loads ahead
makes it). Not counted: ptxas's scoreboards may make an instruction wait for
another load that shares a scoreboard with the one it reads. The opcode rules
cover what ptxas writes for these kernels (sm_80 to sm_90a): which operands an
instruction writes, and which are register pairs, quads or groups.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field, replace

from .sass import Instruction, branch_target, next_kept, parse_instructions

# A register operand: R5, UR4, P0, UP1, with an optional width suffix (R2.64 in an address).
_REGISTER = re.compile(r"(?<![\w.])(U?R\d+|U?P\d+)(?:\.(64|128))?")
_PREDICATE = re.compile(r"^[!]?U?P(?:\d+|T)$")
_GLOBAL_LOADS = frozenset({"LDG", "LD"})
_GLOBAL_STORES = frozenset({"STG", "ST", "RED", "REDG", "ATOM", "ATOMG"})
# Bulk copies and tensor stores from shared memory to global memory: their data is what shared memory holds.
_ASYNC_STORES = frozenset({"UTMASTG", "UBLKRED", "UTMAREDG"})
_NO_RESULT = frozenset(
    {"BRA", "EXIT", "BSSY", "BSYNC", "WARPSYNC", "CALL", "RET", "BAR", "NOP", "MEMBAR", "FENCE", "YIELD"}
    | {"LDGDEPBAR", "DEPBAR", "ARRIVES", "WARPGROUP", "UTMACMDFLUSH", "UTMACCTL", "CCTL", "ERRBAR"}
)
# Instructions whose first two operands are both results (a predicate pair, or SHFL's predicate and value).
_TWO_RESULTS = frozenset({"SHFL", "PLOP3", "UPLOP3"})
_DOUBLE = frozenset({"DADD", "DMUL", "DFMA", "DMNMX", "DSETP"})
# Tensor cores: a warp's mma.sync (HMMA f16/bf16/tf32, QMMA e4m3/e5m2 on sm_89 and sm_120, IMMA integers) and a
# warpgroup's wgmma (sm_90a: HGMMA, QGMMA, IGMMA), whose operands may come from shared memory by descriptor.
TENSOR_CORE = ("HMMA", "QMMA", "HGMMA", "QGMMA")
_WARP_MMA = frozenset({"HMMA", "QMMA", "IMMA"})
_WARPGROUP_MMA = frozenset({"HGMMA", "QGMMA", "IGMMA"})
_ELEMENT_BYTES = {"F16": 2, "BF16": 2, "TF32": 4, "E4M3": 1, "E5M2": 1, "S8": 1, "U8": 1}
# Uniform registers the first operand of a tensor copy names before its coordinates (UTMALDG.2D [UR8]: UR8 the
# shared destination, UR9 the mbarrier, UR10 and UR11 the coordinates; UTMASTG the source; UTMAPF none).
_TENSOR_COPY_HEAD = {"UTMALDG": 2, "UTMASTG": 1, "UTMAPF": 0}


@dataclass(frozen=True)
class LoadDepth:
    """The kernel's depth and each global load's (LDG, and the asynchronous copies), by address."""

    depth: int
    loads: dict[int, int]


def _split(operands: str) -> list[str]:
    """Operands at the top level: commas inside brackets do not split."""
    parts, depth, current = [], 0, []
    for char in operands:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def _registers(operand: str, width: int = 1) -> list[str]:
    """The registers an operand names: a `.64` suffix (or ``width``) widens a register to its pair or quad."""
    found = []
    for match in _REGISTER.finditer(operand):
        name, suffix = match.group(1), match.group(2)
        count = {"64": 2, "128": 4}[suffix] if suffix else width
        prefix = name.rstrip("0123456789")
        number = int(name[len(prefix) :])
        found += [f"{prefix}{number + i}" for i in range(count)] if prefix in ("R", "UR") else [name]
    return found


def _access_width(opcode: tuple[str, ...]) -> int:
    """Registers a load's result or a store's data spans: .128 four, .64 two, else one."""
    return 4 if "128" in opcode else 2 if "64" in opcode else 1


def _result_width(opcode: tuple[str, ...]) -> int:
    name, modifiers = opcode[0], opcode[1:]
    if name in _GLOBAL_LOADS or name in ("LDS", "LDL", "LDC", "ULDC"):
        return _access_width(opcode)
    if name == "LDSM":  # ldmatrix .x1, .x2, .x4: LDSM.16.M88.4 R8 writes R8..R11
        return int(modifiers[-1]) if modifiers and modifiers[-1] in ("1", "2", "4") else 1
    if "WIDE" in modifiers or name in _DOUBLE - {"DSETP"} or (name == "CS2R" and "32" not in modifiers):
        return 2
    if name == "F2I" and ("S64" in modifiers or "U64" in modifiers):
        return 2
    if name in ("F2F", "I2F") and modifiers[:1] == ("F64",):
        return 2
    return 1


def _mma_operands(opcode: tuple[str, ...], operands: list[str]) -> tuple[list[str], list[str]]:
    """A tensor-core instruction's registers, from its shape and types (the PTX ISA's fragment sizes: a
    thread holds m n / 32 accumulators of an m-by-n mma.sync tile and m n / 128 of a wgmma's, whose A comes from
    four registers or a descriptor and B from a descriptor, a pair of uniform registers each).

        HMMA.16816.F32.BF16 R12, R4, R8, R12          D 4, A 4, B 2, C 4 registers
        QGMMA.64x16x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ, !UPT, gsb0    D 8; descriptors UR4..UR7
    """
    name, modifiers = opcode[0], opcode[1:]
    pattern = r"(\d+)x(\d+)x(\d+)" if name in _WARPGROUP_MMA else r"(16)(8)(\d+)"
    shape = re.fullmatch(pattern, modifiers[0]) if modifiers else None
    if shape is None:  # a shape not listed (sm_70's HMMA.884): every operand one register
        return _registers(operands[0]), [r for o in operands[1:] for r in _registers(o)]
    m, n, k = (int(part) for part in shape.groups())
    accumulator = modifiers[1] if len(modifiers) > 1 and modifiers[1] in ("F32", "F16", "S32") else None
    inputs = [_ELEMENT_BYTES[t] for t in modifiers[2 if accumulator else 1 :] if t in _ELEMENT_BYTES]
    element = inputs[0] if inputs else 2
    threads = 128 if name in _WARPGROUP_MMA else 32
    d = m * n * (2 if accumulator == "F16" else 4) // (4 * threads)
    written = _registers(operands[0], d)
    if name in _WARP_MMA:  # D, A, B, C
        a, b = m * k * element // (4 * threads), k * n * element // (4 * threads)
        read = _registers(operands[1], a) + _registers(operands[2], b)
        return written, read + [r for o in operands[3:] for r in _registers(o, d)]
    read: list[str] = []
    for operand in operands[1:]:
        if operand.startswith("gdesc"):
            read += _registers(operand, 4)
        elif operand.startswith("R"):
            read += _registers(operand, 4)  # A from registers: m k / 128 elements of 32 bits' worth, always 4
        else:
            read += _registers(operand)
    accumulates = len(operands) > 2 and operands[-2] != "!UPT"  # scale-d: !UPT writes D = A B
    return written, read + (written if accumulates else [])


def operands_of(instruction: Instruction) -> tuple[list[str], list[str]]:
    """(registers written, registers read) of one instruction, guard predicate excluded."""
    name, opcode = instruction.opcode[0], instruction.opcode
    operands = _split(instruction.operands)
    if name in _GLOBAL_STORES or name in ("STS", "STL", "STSM"):
        address, data = [*operands, ""][:2]
        return [], _registers(address) + _registers(data, _access_width(opcode))
    if name in _WARP_MMA or name in _WARPGROUP_MMA:
        return _mma_operands(opcode, operands)
    if name in _TENSOR_COPY_HEAD or name == "UBLKCP":
        # UTMALDG.2D [UR8], [UR14]: the destination, mbarrier and coordinates from UR8, the tensor map UR14:UR15;
        # UBLKCP.S.G [UR8], [UR4], UR10: destination and mbarrier, the 64-bit source, the bytes.
        dimensions = next((int(m[0]) for m in opcode[1:] if re.fullmatch(r"[1-5]D", m)), 1)
        head = _TENSOR_COPY_HEAD[name] + dimensions if name in _TENSOR_COPY_HEAD else 2
        rest = [r for o in operands[2:] for r in _registers(o)]
        return [], _registers(operands[0], head) + _registers([*operands, ""][1], 2) + rest
    if name in _NO_RESULT or name == "LDGSTS" or not operands:
        return [], [r for o in operands for r in _registers(o)]
    if name in ("VOTE", "VOTEU"):  # VOTE.ANY R3, PT, P0 and VOTEU.ALL UP0, P0: the last operand is the input
        return [r for o in operands[:-1] for r in _registers(o)], _registers(operands[-1])
    if name == "R2P":  # R2P PR, Rx, mask: predicate i from bit i of Rx where the mask has it
        mask = int(operands[2], 16) if len(operands) > 2 else 0x7F
        return [f"P{i}" for i in range(7) if mask >> i & 1], _registers(operands[1])
    if name == "P2R":
        return _registers(operands[0]), [f"P{i}" for i in range(7)] + [r for o in operands[2:] for r in _registers(o)]
    results = 2 if name in _TWO_RESULTS or name.endswith("SETP") else 1
    while results < len(operands) and _PREDICATE.match(operands[results]) and name not in _TWO_RESULTS:
        results += 1  # carry-outs: IADD3 R4, P0, ... and LEA R4, P0, ...
    written = _registers(operands[0], _result_width(opcode)) + [r for o in operands[1:results] for r in _registers(o)]
    read: list[str] = []
    for index, operand in enumerate(operands[results:], start=results):
        wide = ("WIDE" in opcode and index == results + 2) or name in _DOUBLE
        wide = wide or (name == "I2F" and ("S64" in opcode or "U64" in opcode))
        read += _registers(operand, 2 if wide else 1)
    return written, read


@dataclass
class _Path:
    """What the paths reaching one point have done, merged (max) where they join."""

    registers: dict[str, int] = field(default_factory=dict)  # the deepest load each value comes from
    stored: int = 0  # the deepest data a global store has written (an ordered load follows it)
    waited: int = 0  # the deepest load data an instruction has read: in-order issue waited for it
    shared: int = 0  # the deepest load data shared memory holds for a read (stored there, or copied and waited for)
    groups: tuple[int, ...] = ()  # LDGSTS groups committed (LDGDEPBAR) and not waited for, oldest first
    open_group: int = 0  # LDGSTS issued since the last commit
    tracked: int = 0  # copies an mbarrier will see complete (UTMALDG, UBLKCP, LDGSTS after ARRIVES), not waited for
    mma: bool = False  # a tensor-core instruction has issued on every path here

    @classmethod
    def join(cls, paths: list[_Path]) -> _Path:
        if not paths:
            return cls()
        registers: dict[str, int] = {}
        for path in paths:
            for name, depth in path.registers.items():
                registers[name] = max(registers.get(name, 0), depth)
        longest = max(len(p.groups) for p in paths)  # the newest groups line up: DEPBAR counts from the newest
        groups = tuple(map(max, zip(*[(0,) * (longest - len(p.groups)) + p.groups for p in paths], strict=True)))
        scalars = ("stored", "waited", "shared", "open_group", "tracked")
        merged = {name: max(getattr(p, name) for p in paths) for name in scalars}
        return cls(registers, groups=groups, mma=all(p.mma for p in paths), **merged)

    def consume(self, depth: int, in_order: bool) -> None:
        """A wait for copied data: it is in shared memory now, and in order nothing issues before it arrived."""
        self.shared = max(self.shared, depth)
        if in_order:
            self.waited = max(self.waited, depth)

    def published(self, in_order: bool) -> int:
        """What an arrival tells the threads that wait for it: the data in shared memory, and in order the data
        the arriving thread had waited for."""
        return max(self.shared, self.waited if in_order else 0)


def _load_kind(opcode: tuple[str, ...]) -> str | None:
    """How a global load's data arrives: "register" (LDG), "group" (LDGSTS, cp.async: waited for by DEPBAR, or
    an mbarrier after ARRIVES.LDGSTSBAR), "mbarrier" (the bulk and tensor copies into shared memory); None for
    an instruction that loads nothing from global memory."""
    name = opcode[0]
    if name in _GLOBAL_LOADS:
        return "register"
    if name == "LDGSTS":
        return "group"
    if name == "UTMALDG" or (name == "UBLKCP" and opcode[1:2] == ("S",)):  # UBLKCP.S.G: global to shared
        return "mbarrier"
    return None


@dataclass
class _Block:
    start: int  # index of its first instruction
    end: int  # one past its last
    successors: list[int]


def _layout(code: list[Instruction], labels: dict[str, int]) -> list[_Block]:
    """Basic blocks as the code lays them out, each with the blocks its last instruction may go to (-1 the
    kernel's exit), a CALL's fall-through included: ``_flow`` decides where a CALL and a RET go."""
    index_of = {i.address: n for n, i in enumerate(code)}
    addresses = [i.address for i in code]

    def target_of(instruction: Instruction) -> int | None:
        # An address between kept instructions (a dropped NOP's, as a literal target names it; parse_instructions
        # moves labels already) goes on at the next one; past the last, nowhere (the kernel's end).
        target = branch_target(instruction, labels)
        if target is None or target in index_of:
            return target
        goes_on = next_kept(addresses, target)
        return target if goes_on is None else goes_on

    leaders = {0}
    for n, i in enumerate(code):
        if i.opcode[0] in ("BRA", "EXIT", "RET", "BRX", "JMP", "CALL"):
            leaders.add(n + 1)
            target = target_of(i)
            if i.opcode[0] in ("BRA", "CALL") and target in index_of:
                leaders.add(index_of[target])
    starts = sorted(n for n in leaders if n < len(code))
    block_at = {start: b for b, start in enumerate(starts)}
    blocks = [_Block(start, end, []) for start, end in zip(starts, [*starts[1:], len(code)], strict=True)]
    for block in blocks:
        last = code[block.end - 1]
        after = block_at.get(block.end)
        name = last.opcode[0]
        target = target_of(last)
        if name in ("BRX", "JMP"):
            raise ValueError(f"an indirect branch at {last.address:#x}: the depth needs every target known")
        if name == "CALL" and target not in index_of:
            raise ValueError(f"a CALL at {last.address:#x} to an unknown target")
        if name in ("BRA", "CALL"):
            block.successors.append(block_at[index_of[target]] if target in index_of else -1)
        elif name in ("EXIT", "RET"):
            block.successors.append(-1)
        # BRA.DIV ~URZ, target: a branch taken only where the warp has diverged (to a shuffle's slow path).
        conditional = last.predicated or (name == "BRA" and len(_split(last.operands)) > 1)
        if (name not in ("BRA", "EXIT", "RET") or conditional) and after is not None:
            block.successors.append(after)
    return blocks


def basic_blocks(code: list[Instruction], labels: dict[str, int]) -> list[tuple[int, int, list[int]]]:
    """The code's basic blocks as laid out: each one's first instruction's index, one past its last, and the blocks
    its last instruction may go to (-1: the kernel's exit; a CALL's target and fall-through both)."""
    return [(block.start, block.end, list(block.successors)) for block in _layout(code, labels)]


def _returns(code: list[Instruction], layout: list[_Block]) -> set[int]:
    """The blocks a CALL enters that reach a RET, nested CALLs stepped over: subroutines (ptxas's arithmetic
    helpers, such as the 64-bit division, and its out-of-line shuffles). A CALL whose target reaches none is
    a jump: ptxas's CALL.REL.NOINC out of a loop under divergent flow, to a label of the kernel's own."""
    calls = {b.successors[0] for b in layout if code[b.end - 1].opcode[0] == "CALL" and b.successors[0] != -1}
    found = set()
    for entry in calls:
        seen, stack = {entry}, [entry]
        while stack:
            block = layout[stack.pop()]
            last = code[block.end - 1]
            if last.opcode[0] == "RET":
                found.add(entry)
                break
            steps = block.successors[1:] if last.opcode[0] == "CALL" else block.successors
            for successor in steps:
                if successor != -1 and successor not in seen:
                    seen.add(successor)
                    stack.append(successor)
    return found


def _flow(code: list[Instruction], labels: dict[str, int]) -> list[_Block]:
    """The blocks of the kernel's flow from its entry, block 0, with their successors (block indices; -1 is
    the kernel's exit). A subroutine's blocks are copied at each CALL that enters it, and its RET goes back to
    the instruction after that CALL: its instructions are walked as part of the caller's path, so depth flows
    in through the registers and what the warp waited for, and out through its results alone."""
    layout = _layout(code, labels)
    subroutines = _returns(code, layout)
    block_at = {block.start: b for b, block in enumerate(layout)}
    flow: list[_Block] = []
    node: dict[tuple[tuple[int, ...], int], int] = {}  # (the CALLs the path is inside, a laid-out block)
    pending: list[tuple[tuple[int, ...], int]] = []

    def enter(calls: tuple[int, ...], block: int) -> int:
        if block == -1:
            return -1
        if (calls, block) not in node:
            node[calls, block] = len(flow)
            flow.append(_Block(layout[block].start, layout[block].end, []))
            pending.append((calls, block))
        return node[calls, block]

    enter((), 0)
    while pending:
        calls, block = pending.pop()
        here, successors = flow[node[calls, block]], layout[block].successors
        last = here.end - 1
        name = code[last].opcode[0]
        if name == "CALL" and successors[0] in subroutines:
            if last in calls:
                raise ValueError(f"a recursive CALL at {code[last].address:#x}")
            here.successors.append(enter((*calls, last), successors[0]))
            if code[last].predicated:
                here.successors += [enter(calls, s) for s in successors[1:]]
        elif name == "RET" and calls:
            back = block_at.get(calls[-1] + 1, -1)
            here.successors += [enter(calls[:-1], back)] + [enter(calls, s) for s in successors[1:]]
        elif name == "CALL":  # a jump: its fall-through is a path only where the CALL is predicated
            here.successors += [enter(calls, s) for s in successors[: 2 if code[last].predicated else 1]]
        else:
            here.successors += [enter(calls, s) for s in successors]
    return flow


def _forward_edges(blocks: list[_Block]) -> tuple[list[int], dict[int, list[int]]]:
    """A topological order of the blocks reachable from the entry, and each one's successors without the
    back edges (an edge to a block on the depth-first path): the loop bodies once."""
    forward: dict[int, list[int]] = {}
    order: list[int] = []
    state: dict[int, int] = {}  # 1 on the path, 2 done
    stack: list[tuple[int, int]] = [(0, 0)]
    state[0] = 1
    forward[0] = []
    while stack:
        block, next_successor = stack[-1]
        successors = blocks[block].successors
        if next_successor < len(successors):
            stack[-1] = (block, next_successor + 1)
            successor = successors[next_successor]
            if successor == -1 or state.get(successor) == 1:
                if successor == -1:
                    forward[block].append(-1)
                continue
            forward[block].append(successor)
            if successor not in state:
                state[successor] = 1
                forward[successor] = []
                stack.append((successor, 0))
        else:
            state[block] = 2
            order.append(block)
            stack.pop()
    order.reverse()
    return order, forward


def _control(order: list[int], forward: dict[int, list[int]]) -> dict[int, list[int]]:
    """The branch blocks each block is control dependent on (Ferrante et al.: S depends on A when S
    post-dominates a successor of A but not A itself), over the forward edges."""
    postdom: dict[int, frozenset[int]] = {-1: frozenset({-1})}
    for block in reversed(order):
        successors = forward[block] or [-1]
        common = frozenset.intersection(*(postdom[s] for s in successors))
        postdom[block] = common | {block}
    depends: dict[int, list[int]] = defaultdict(list)
    for block in order:
        if len(set(forward[block])) < 2:
            continue
        for successor in set(forward[block]) - {-1}:
            for dependent in postdom[successor] - postdom[block]:
                depends[dependent].append(block)
    return depends


@dataclass(frozen=True)
class _Kernel:
    """One kernel's SASS as the walk needs it: instructions, the blocks of its flow (``_flow``) in topological
    order with their forward successors, and the branches each block is control dependent on."""

    code: list[Instruction]
    blocks: list[_Block]
    order: list[int]
    forward: dict[int, list[int]]
    depends: dict[int, list[int]]

    @classmethod
    def of(cls, sass: str) -> _Kernel:
        code, labels = parse_instructions(sass)
        blocks = _flow(code, labels) if code else []
        order, forward = _forward_edges(blocks) if code else ([], {})
        return cls(code, blocks, order, forward, _control(order, forward))

    def exclusive(self) -> dict[int, set[int]]:
        """Each block's blocks that are neither before nor after it on any forward path: another role's."""
        after: dict[int, set[int]] = {}
        for block in reversed(self.order):
            after[block] = set().union(*(after[s] | {s} for s in self.forward[block] if s != -1))
        everything = set(self.order)
        return {b: everything - after[b] - {a for a in self.order if b in after[a]} - {b} for b in self.order}


@dataclass(frozen=True)
class _Walk:
    loads: dict[int, int]  # each global load's depth, by address
    first_mma: int | None  # the deepest data waited for where a path's first tensor-core instruction issues
    published: dict[int, tuple[int, int]]  # by block: what its arrivals publish to mbarrier waits and to BAR


def _walk(kernel: _Kernel, in_order: bool, tensor_core: frozenset[str], others: dict[int, tuple[int, int]]) -> _Walk:
    """One pass over the forward paths; ``others`` is what other roles publish to each block's waits."""
    code, blocks = kernel.code, kernel.blocks
    incoming: dict[int, list[_Path]] = defaultdict(list)
    ending: dict[int, dict[str, int]] = {}
    control: dict[int, int] = {}
    loads: dict[int, int] = {}
    published: dict[int, tuple[int, int]] = {}
    first: int | None = None
    for block in kernel.order:
        path = _Path.join(incoming[block])
        registers = path.registers
        guard = 0
        for branch in kernel.depends[block]:
            last = code[blocks[branch].end - 1]
            predicate = last.guard.lstrip("!")
            guard = max(guard, control[branch], ending[branch].get(predicate, 0))
        control[block] = guard
        to_mbarrier, to_barrier = others.get(block, (0, 0))
        publish = [0, 0]
        for instruction in code[blocks[block].start : blocks[block].end]:
            opcode, name = instruction.opcode, instruction.opcode[0]
            written, read = operands_of(instruction)
            data = max([registers.get(instruction.guard.lstrip("!"), 0)] + [registers.get(r, 0) for r in read])
            if in_order:  # the instruction waits for what it reads; nothing after it issues earlier
                path.waited = max(path.waited, data)
            depth = max(guard, data)
            kind = _load_kind(opcode)
            if kind is not None:
                ordered = "CONSTANT" not in opcode
                depth = 1 + max(depth, path.stored if ordered else 0, path.waited if in_order else 0)
                # A subroutine's load is walked at each CALL that enters it: the deepest counts.
                loads[instruction.address] = max(loads.get(instruction.address, 0), depth)
                if kind == "group":
                    path.open_group = max(path.open_group, depth)
                elif kind == "mbarrier":
                    path.tracked = max(path.tracked, depth)
                    publish[0] = max(publish[0], depth)
            elif name in _GLOBAL_STORES or name in ("STS", "STSM"):
                _, stored = [*_split(instruction.operands), ""][:2]
                value = max([0] + [registers.get(r, 0) for r in _registers(stored, _access_width(opcode))])
                if name in _GLOBAL_STORES:
                    path.stored = max(path.stored, value)
                else:
                    path.shared = max(path.shared, value)
            elif name in _ASYNC_STORES or name == "UBLKCP":  # UBLKCP.G.S: shared to global
                path.stored = max(path.stored, path.shared)
            elif name in ("LDS", "LDSM") or name in _WARPGROUP_MMA:
                depth = max(depth, path.shared)
            elif name == "LDGDEPBAR":
                path.groups, path.open_group = (*path.groups, path.open_group), 0
            elif name == "DEPBAR" and _split(instruction.operands)[:1] == ["SB0"]:
                # DEPBAR.LE SB0, n: every committed group but the newest n has arrived.
                keep = int(_split(instruction.operands)[1], 0)
                done = path.groups[: max(len(path.groups) - keep, 0)]
                path.groups = path.groups[len(done) :]
                path.consume(max(done, default=0), in_order)
            elif name == "ARRIVES":  # ARRIVES.LDGSTSBAR: the mbarrier sees this thread's LDGSTS complete
                copies = max([path.open_group, *path.groups])
                path.tracked = max(path.tracked, copies)
                publish[0] = max(publish[0], copies)
            elif name == "SYNCS" and "PHASECHK" in opcode:  # mbarrier try_wait and test_wait
                path.consume(max(path.tracked, to_mbarrier), in_order)
                path.tracked = 0
            elif name == "SYNCS" and any(m.startswith("ARRIVE") for m in opcode[1:]):
                publish[0] = max(publish[0], path.published(in_order))
            elif name == "BAR":
                publish[1] = max(publish[1], path.published(in_order))
                if "ARV" not in opcode and "ARRIVE" not in opcode:
                    path.consume(to_barrier, in_order)
            if name in tensor_core and not path.mma:
                first = max(first or 0, depth, path.waited if in_order else 0)
                path.mma = True
            for register in written:
                kept = registers.get(register, 0) if instruction.predicated else 0
                registers[register] = max(kept, depth)
        ending[block] = registers
        published[block] = (publish[0], publish[1])
        for successor in kernel.forward[block]:
            if successor != -1:
                incoming[successor].append(replace(path, registers=dict(registers)))
    return _Walk(loads, first, published)


def _analyse(sass: str, in_order: bool, tensor_core: frozenset[str] = frozenset(TENSOR_CORE)) -> _Walk:
    """The walk of one kernel's SASS, with what its other roles publish when they run alone (one hand-off)."""
    kernel = _Kernel.of(sass)
    alone = _walk(kernel, in_order, tensor_core, {})
    if not any(any(values) for values in alone.published.values()):
        return alone
    others = {
        block: (
            max((alone.published[x][0] for x in exclusive), default=0),
            max((alone.published[x][1] for x in exclusive), default=0),
        )
        for block, exclusive in kernel.exclusive().items()
    }
    return _walk(kernel, in_order, tensor_core, others)


def load_depth(sass: str, *, in_order: bool = True) -> LoadDepth:
    """The global-load depth of one kernel's SASS (nvdisasm's text, one kernel): see the module's docstring.

    Parameters
    ----------
    in_order
        True (the default): count in-order issue; a load issued after an instruction that read loaded data
        starts a new round trip. False: dependence only, the rule before in-order issue.
    """
    walk = _analyse(sass, in_order)
    return LoadDepth(max(walk.loads.values(), default=0), walk.loads)


def depth_before_first(sass: str, opcodes: tuple[str, ...] = TENSOR_CORE, *, in_order: bool = True) -> int:
    """The round trips before a kernel's first tensor-core instruction issues: the deepest global data
    (loaded, or copied to shared memory and waited for) that the warp waited for, or that the instruction's
    operands come from, where the first of ``opcodes`` on a path issues; the largest over the paths.

        depth_before_first = max over paths of (deepest load data waited for at the path's first MMA)

    In a warp-specialised kernel the consumer's MMA waits on an mbarrier that the producer's copies complete:
    that is the producer's chain (the module's docstring, "Roles"). Not the kernel's load depth: loads after
    the first MMA (the next tiles) do not count.

    Raises
    ------
    ValueError
        When no instruction of ``opcodes`` is in ``sass``.
    """
    first = _analyse(sass, in_order, frozenset(opcodes)).first_mma
    if first is None:
        raise ValueError(f"Invalid sass: expected a tensor-core instruction ({', '.join(opcodes)}), got none")
    return first
