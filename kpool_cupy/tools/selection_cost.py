"""The instructions a thread of ``kpool_index_topk`` issues in its streaming selection (kernels/kpool_select.cuh's
``select_best``), from the loops of its SASS and what the selection did (``tools.selection_trace``).

A static count takes each loop's body once. The selection's loops run as often as the logits make them:

    tile loop      once a tile; its cut-back (the part of its body off the path a tile takes when it is not cut
                   back, a radix select and a compaction among it) once a cut-back
    radix select   four rounds, each its straight code once and its histogram loop once a 256 buffer entries
    compaction     once a 1,024 buffer entries
    seed, finish   the radix select that starts the range from a threshold; the cut-back after the last tile

so a thread's count is the static one with these loops' bodies taken out and put back as the trace ran them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .load_depth import basic_blocks
from .sass import Instruction, loop_spans, parse_instructions
from .selection_trace import RADIX_ROUNDS, SELECT_CHUNK, SELECT_THREADS, SelectionTrace

Span = tuple[int, int]


@dataclass(frozen=True)
class RadixLoops:
    """A radix select's loops: ``rounds`` the instructions of its loop over rounds (its histogram loop's among
    them), ``histogram`` those of its loop over the buffer (0: none, as where the buffer is known empty), which
    ptxas unrolls: its body holds ``unroll`` trips of 256 entries (a warp vote each), the rounds loop's own code
    the trips left over."""

    rounds: int
    histogram: int
    unroll: int = 1

    def issued(self, count: int) -> int:
        """Its instructions over a buffer of ``count`` entries: the histogram loop's body once for each
        ``unroll`` trips or part (the part left over taken as a whole body, with the rounds' own code whole:
        an upper bound)."""
        trips = -(-count // SELECT_THREADS)
        bodies = -(-trips // self.unroll)
        return RADIX_ROUNDS * (self.rounds - self.histogram + bodies * self.histogram)


@dataclass(frozen=True)
class SelectionLoops:
    """select_best's loops in a kernel's SASS (``selection_loops``), each as instructions."""

    tile_loop: int  # the tile loop's body, its cut-back's included
    tile_path: int  # a tile not cut back: the longest path through the body that enters none of its loops
    cut_straight: int  # the body's instructions on neither that path nor an inner loop: a cut-back's own
    cut_radix: RadixLoops
    cut_compaction: int
    finish_radix: RadixLoops
    finish_compaction: int
    seed_radix: RadixLoops
    # The block-wide barriers (BAR) a tile not cut back meets, a cut-back's radix round and its compaction trip:
    # what tools/selection_trace.py's SelectionTrace.barriers counts, checked against the emulator.
    barriers: tuple[int, int, int] = (0, 0, 0)
    # The code after the finish's compaction up to the end of the merge's (a split's list published, the lists
    # merged: gather_splits), which a row that one block selects never runs.
    merge: int = 0

    def static(self) -> int:
        """What the static count holds of these loops (each body once)."""
        return self.tile_loop + self.finish_radix.rounds + self.finish_compaction + self.seed_radix.rounds

    def issued(self, trace: SelectionTrace) -> int:
        """What a thread issues in them over one range the trace describes."""
        total = trace.tiles * self.tile_path + len(trace.cuts) * self.cut_straight
        total += sum(self.cut_radix.issued(count) + _chunks(count) * self.cut_compaction for count in trace.cuts)
        if trace.finish is not None:
            total += self.finish_radix.issued(trace.finish) + _chunks(trace.finish) * self.finish_compaction
        if trace.seeded:
            total += self.seed_radix.issued(0)
        return total


def _chunks(count: int) -> int:
    return -(-count // SELECT_CHUNK)


def _inside(inner: Span, outer: Span) -> bool:
    return inner != outer and outer[0] <= inner[0] and inner[1] <= outer[1]


def longest_path(code: list[Instruction], labels: dict[str, int], loop: Span, avoid: list[Span]) -> list[Instruction]:
    """The instructions on the longest path from the loop's first instruction to its backward branch that stays
    in the loop, outside every span of ``avoid``, on forward edges."""
    blocks = basic_blocks(code, labels)
    address = [code[start].address for start, _, _ in blocks]

    def allowed(block: int) -> bool:
        at = address[block]
        return loop[0] <= at <= loop[1] and not any(s[0] <= at <= s[1] for s in avoid)

    head = address.index(loop[0])
    latch = next(b for b, (_, end, _) in enumerate(blocks) if code[end - 1].address == loop[1])

    @functools.cache
    def longest(block: int) -> tuple[int, ...] | None:  # the blocks from here to the latch
        if block == latch:
            return (block,)
        onward = [longest(s) for s in blocks[block][2] if s > block and allowed(s)]
        reached = [path for path in onward if path is not None]
        if not reached:
            return None
        return (block, *max(reached, key=lambda path: sum(blocks[b][1] - blocks[b][0] for b in path)))

    found = longest(head)
    if found is None:
        raise ValueError(f"no path through the loop at {loop[0]:#x} avoids its inner loops")
    return [code[n] for b in found for n in range(blocks[b][0], blocks[b][1])]


def selection_loops(sass: str) -> SelectionLoops:
    """select_best's loops in ``sass`` (kpool_index_topk's): the tile loop, the kernel's largest, holds a radix
    select's rounds loop (around its histogram loop) and a compaction loop; the seed's rounds loop is the last
    loop with a barrier before it, the finish's radix select and compaction the first such loops after it. A
    ValueError where the code has another shape."""
    code, labels = parse_instructions(sass)
    spans = loop_spans(code, labels)

    def size(span: Span) -> int:
        return sum(span[0] <= i.address <= span[1] for i in code)

    def barriers(span: Span) -> int:
        return sum(span[0] <= i.address <= span[1] and i.opcode[0] == "BAR" for i in code)

    def has_barrier(span: Span) -> bool:
        return barriers(span) > 0

    def within(span: Span) -> list[Span]:
        return sorted(s for s in spans if _inside(s, span))

    def radix(rounds: Span) -> RadixLoops:
        inner = within(rounds)
        if len(inner) > 1:
            raise ValueError(f"the rounds loop at {rounds[0]:#x} holds {len(inner)} loops, not one")
        if not inner:
            return RadixLoops(size(rounds), 0)
        histogram = inner[0]
        # A trip loads one buffer key (LDS) and votes once in add_to_histogram (VOTE.ALL: do its counting lanes
        # share a digit); the two counts agree where the body holds whole trips.
        body = [i for i in code if histogram[0] <= i.address <= histogram[1]]
        votes = sum(i.opcode[:2] == ("VOTE", "ALL") for i in body)
        if votes < 1 or votes != sum(i.opcode[0] == "LDS" for i in body):
            raise ValueError(f"the histogram loop at {histogram[0]:#x} holds no whole trips")
        return RadixLoops(size(rounds), size(histogram), votes)

    tile = max(spans, key=size)
    inner = within(tile)
    rounds = [s for s in inner if within(s)]
    compaction = [s for s in inner if not within(s) and not any(_inside(s, r) for r in rounds) and has_barrier(s)]
    if len(rounds) != 1 or len(compaction) != 1:
        raise ValueError(f"the tile loop at {tile[0]:#x} holds {len(rounds)} rounds and {len(compaction)} compaction")
    seed = [s for s in spans if s[1] < tile[0] and has_barrier(s)]
    # After the tile loop, the outermost loops with a barrier: the finish's rounds (around a histogram loop) and
    # compaction; gather_splits's: the published list's radix select, the merge's tile loop, its finish's rounds
    # and compaction.
    after = [s for s in sorted(spans) if s[0] > tile[1] and has_barrier(s) and not any(_inside(s, o) for o in spans)]
    shape = [bool(within(s)) for s in after[:6]]
    if not seed or shape != [True, False, True, True, True, False]:
        raise ValueError(f"no seed before the tile loop, or not the finish and the merge after it: {shape}")
    finish, finish_compaction = after[0], after[1]
    merge = sum(finish_compaction[1] < i.address <= after[5][1] for i in code)
    path = longest_path(code, labels, tile, inner)
    round_barriers = barriers(rounds[0]) - sum(barriers(s) for s in within(rounds[0]))
    in_inner = sum(size(s) for s in inner if not any(_inside(s, o) for o in inner))
    return SelectionLoops(
        size(tile),
        len(path),
        size(tile) - len(path) - in_inner,
        radix(rounds[0]),
        size(compaction[0]),
        radix(finish),
        size(finish_compaction),
        radix(max(seed)),
        (sum(i.opcode[0] == "BAR" for i in path), round_barriers, barriers(compaction[0])),
        merge,
    )
