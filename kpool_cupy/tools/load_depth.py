"""The dependent global-load depth of a kernel, read off its SASS: how many memory round trips a thread waits
through, one after another, before its last global load can issue.

A global load (LDG) is at depth d + 1 when its address, its guard predicate,
a branch that guards it (control dependence), or the data of a global store
it must follow depends on a load at depth d; a load that depends on no load
is at depth 1. Read-only loads (LDG.*.CONSTANT: `const __restrict__` data,
which the kernel never writes) need not follow stores. The depth of a kernel
is the largest over its paths, a loop's body counted once (back edges are
dropped), a subroutine entered from its CALL and left by its RET.

Registers carry the largest depth of the loads their value comes from,
merged (max) where paths join; a value computed under a branch carries the
branch's too, as a value chosen by the path would. The opcode rules cover
what ptxas writes for these kernels (sm_80 to sm_90): which operands an
instruction writes, and which are 64-bit register pairs.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from .sass import Instruction, branch_target, parse_instructions

# A register operand: R5, UR4, P0, UP1, with an optional width suffix (R2.64 in an address).
_REGISTER = re.compile(r"(?<![\w.])(U?R\d+|U?P\d+)(?:\.(64|128))?")
_PREDICATE = re.compile(r"^[!]?U?P(?:\d+|T)$")
_GLOBAL_LOADS = frozenset({"LDG", "LD"})
_GLOBAL_STORES = frozenset({"STG", "ST", "RED", "REDG", "ATOM", "ATOMG"})
_NO_RESULT = frozenset({"BRA", "EXIT", "BSSY", "BSYNC", "WARPSYNC", "CALL", "RET", "BAR", "NOP", "MEMBAR", "FENCE"})
# Instructions whose first two operands are both results (a predicate pair, or SHFL's predicate and value).
_TWO_RESULTS = frozenset({"SHFL", "VOTE", "VOTEU", "PLOP3", "UPLOP3"})
_DOUBLE = frozenset({"DADD", "DMUL", "DFMA", "DMNMX", "DSETP"})


@dataclass(frozen=True)
class LoadDepth:
    """The kernel's depth and each global load's, by address."""

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
    if "WIDE" in modifiers or name in _DOUBLE - {"DSETP"} or (name == "CS2R" and "32" not in modifiers):
        return 2
    if name == "F2I" and ("S64" in modifiers or "U64" in modifiers):
        return 2
    if name in ("F2F", "I2F") and modifiers[:1] == ("F64",):
        return 2
    return 1


def operands_of(instruction: Instruction) -> tuple[list[str], list[str]]:
    """(registers written, registers read) of one instruction, guard predicate excluded."""
    name, opcode = instruction.opcode[0], instruction.opcode
    operands = _split(instruction.operands)
    if name in _GLOBAL_STORES or name in ("STS", "STL"):
        address, data = [*operands, ""][:2]
        return [], _registers(address) + _registers(data, _access_width(opcode))
    if name in _NO_RESULT or not operands:
        return [], [r for o in operands for r in _registers(o)]
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
class _Block:
    start: int  # index of its first instruction
    end: int  # one past its last
    successors: list[int]


@dataclass(frozen=True)
class _Subroutine:
    """What a CALL does to the caller's registers: everything it writes comes from everything it reads."""

    reads: frozenset[str]
    writes: frozenset[str]


def _subroutines(code: list[Instruction], labels: dict[str, int]) -> dict[int, _Subroutine]:
    """Each CALL's summary, by the CALL's index: the callee's instructions run from its label to its first RET
    (ptxas's arithmetic helpers, such as the 64-bit division). A callee that loads from global memory would
    need more than a summary: refused."""
    index_of = {i.address: n for n, i in enumerate(code)}
    summaries: dict[int, _Subroutine] = {}
    for n, instruction in enumerate(code):
        if instruction.opcode[0] != "CALL":
            continue
        target = branch_target(instruction, labels)
        if target not in index_of:
            raise ValueError(f"a CALL at {instruction.address:#x} to an unknown target")
        reads: set[str] = set()
        writes: set[str] = set()
        for callee in code[index_of[target] :]:
            if callee.opcode[0] in _GLOBAL_LOADS:
                raise ValueError(f"a subroutine at {target:#x} loads from global memory")
            written, read = operands_of(callee)
            reads |= set(read) | ({callee.guard.lstrip("!")} if callee.guard else set())
            writes |= set(written)
            if callee.opcode[0] == "RET":
                break
        summaries[n] = _Subroutine(frozenset(reads), frozenset(writes))
    return summaries


def _blocks(code: list[Instruction], labels: dict[str, int]) -> list[_Block]:
    """Basic blocks with their successors (block indices; -1 is the kernel's exit). A CALL continues with the
    next instruction (``_subroutines`` stands for the callee); a RET ends a callee, which the kernel's own
    flow never enters."""
    index_of = {i.address: n for n, i in enumerate(code)}
    leaders = {0}
    for n, i in enumerate(code):
        if i.opcode[0] in ("BRA", "EXIT", "RET", "BRX", "JMP"):
            leaders.add(n + 1)
            target = branch_target(i, labels)
            if i.opcode[0] == "BRA" and target is not None and target in index_of:
                leaders.add(index_of[target])
    starts = sorted(n for n in leaders if n < len(code))
    block_at = {start: b for b, start in enumerate(starts)}
    blocks = [_Block(start, end, []) for start, end in zip(starts, [*starts[1:], len(code)], strict=True)]
    for block in blocks:
        last = code[block.end - 1]
        after = block_at.get(block.end)
        name = last.opcode[0]
        target = branch_target(last, labels)
        if name in ("BRX", "JMP"):
            raise ValueError(f"an indirect branch at {last.address:#x}: the depth needs every target known")
        if name == "BRA":
            block.successors.append(block_at[index_of[target]] if target in index_of else -1)
            if last.predicated and after is not None:
                block.successors.append(after)
        elif name in ("EXIT", "RET"):
            block.successors.append(-1)
            if name == "EXIT" and last.predicated and after is not None:
                block.successors.append(after)
        elif after is not None:
            block.successors.append(after)
    return blocks


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


def load_depth(sass: str) -> LoadDepth:
    """The dependent global-load depth of one kernel's SASS (nvdisasm's text, one kernel)."""
    code, labels = parse_instructions(sass)
    if not code:
        return LoadDepth(0, {})
    blocks = _blocks(code, labels)
    calls = _subroutines(code, labels)
    order, forward = _forward_edges(blocks)
    depends = _control(order, forward)
    incoming: dict[int, list[tuple[dict[str, int], int]]] = defaultdict(list)
    ending: dict[int, dict[str, int]] = {}
    control: dict[int, int] = {}
    loads: dict[int, int] = {}
    for block in order:
        registers: dict[str, int] = {}
        memory = 0
        for state, stored in incoming[block]:
            memory = max(memory, stored)
            for name, depth in state.items():
                registers[name] = max(registers.get(name, 0), depth)
        guard = 0
        for branch in depends[block]:
            last = code[blocks[branch].end - 1]
            predicate = last.guard.lstrip("!")
            guard = max(guard, control[branch], ending[branch].get(predicate, 0))
        control[block] = guard
        for index in range(blocks[block].start, blocks[block].end):
            instruction = code[index]
            written, read = operands_of(instruction)
            if index in calls:
                written, read = sorted(calls[index].writes), sorted(calls[index].reads)
            depth = max([guard, registers.get(instruction.guard.lstrip("!"), 0)] + [registers.get(r, 0) for r in read])
            name = instruction.opcode[0]
            if name in _GLOBAL_LOADS:
                ordered = "CONSTANT" not in instruction.opcode
                depth = 1 + max(depth, memory if ordered else 0)
                loads[instruction.address] = depth
            elif name in _GLOBAL_STORES:
                _, data = [*_split(instruction.operands), ""][:2]
                width = _access_width(instruction.opcode)
                memory = max([memory] + [registers.get(r, 0) for r in _registers(data, width)])
            for register in written:
                kept = registers.get(register, 0) if instruction.predicated else 0
                registers[register] = max(kept, depth)
        ending[block] = registers
        for successor in forward[block]:
            if successor != -1:
                incoming[successor].append((registers, memory))
    return LoadDepth(max(loads.values(), default=0), loads)
