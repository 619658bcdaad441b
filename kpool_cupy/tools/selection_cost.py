"""The instructions a thread issues in the streaming selection (kernels/kpool_select.cuh): ``kpool_index_topk``'s
``select_best`` and its split rows' merge, and ``kpool_index_select_fp8``'s offers, from the loops of the SASS and
what the selection did (``tools.selection_trace``).

A static count takes each loop's body once. The selection's loops run as often as the logits make them:

    offer loop     once a tile, on the path a whole tile of an aligned row takes (16-byte loads; a row's last
                   tile may take 4-byte loads for a group the range ends in); its cut-back (the part of its
                   body off that path, a radix select and a compaction among it) once a cut-back
    radix select   up to four rounds (as many as the trace's ``radix_select`` took; a round that ends at its tie
                   check counted whole, an upper bound), each its straight code once
                   and its histogram loop's body once a trip of 256 buffer entries (``#pragma unroll 1``; where
                   ptxas unrolls it, once for each ``RadixLoops.unroll`` trips)
    compaction     once a 1,024 buffer entries
    seed, finish   the radix select that starts the range from a threshold (two or three rounds in select_best); the
                   cut-back after the last tile
    publish, merge a split row's list (its m-th largest key's radix select as the trace's took) and its lists'
                   merge (an offer loop over the lists' slots and its finish, as the trace's ran), which a row
                   that one block selects never runs

so a thread's count is the static one with these loops' bodies taken out and put back as the trace ran them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .load_depth import TENSOR_CORE, basic_blocks
from .sass import Instruction, loop_spans, parse_instructions
from .selection_trace import FOUR_ROUNDS, SELECT_CHUNK, SELECT_THREADS, Search, SelectionTrace, SplitTrace

Span = tuple[int, int]


@dataclass(frozen=True)
class RadixLoops:
    """A radix select's loops: ``rounds`` the instructions of its loop over rounds (its histogram loop's among
    them), ``histogram`` those of its loop over the buffer (0: none, as where the buffer is known empty), whose
    body holds ``unroll`` trips of 256 entries (a warp vote each; 1 since kth_largest_key asks ptxas not to
    unroll it, which had copied the trips left over into the rounds loop's own code)."""

    rounds: int
    histogram: int
    unroll: int = 1

    def issued(self, count: int, search: Search = FOUR_ROUNDS) -> int:
        """Its instructions over a buffer of ``count`` entries in the rounds of ``search``: the histogram loop's
        body once for each ``unroll`` trips or part (the part left over taken as a whole body, with the rounds' own
        code whole, and a round that ends at its tie check as a whole round: an upper bound)."""
        trips = -(-count // SELECT_THREADS)
        bodies = -(-trips // self.unroll)
        return search.rounds * (self.rounds - self.histogram + bodies * self.histogram)


@dataclass(frozen=True)
class OfferLoops:
    """A loop that offers a tile of candidates a trip (select_best's tile loop; the fused select's loop over a
    chunk's tokens), each as instructions: ``loop`` its body, its cut-back's included; ``path`` a tile not cut
    back, the longest path through the body that enters none of its loops nor a partial group's 4-byte loads
    (``_Reading.partial_loads``); ``cut_straight`` the body's instructions on neither that path nor an inner loop
    nor those loads (a cut-back's own); the cut-back's radix select and
    compaction; ``barriers`` the block-wide barriers (BAR) a tile not cut back meets, a radix round and a
    compaction trip, what tools/selection_trace.py's SelectionTrace.barriers counts."""

    loop: int
    path: int
    cut_straight: int
    radix: RadixLoops
    compaction: int
    barriers: tuple[int, int, int]

    def issued(self, tiles: int, cuts: tuple[int, ...], searches: tuple[Search, ...] | None = None) -> int:
        """What a thread issues in it over ``tiles`` offers that cut back at the buffer fills ``cuts``, their
        radix selects ``searches`` (None: four whole rounds each)."""
        total = tiles * self.path + len(cuts) * self.cut_straight
        each = searches if searches is not None else (FOUR_ROUNDS,) * len(cuts)
        pairs = zip(cuts, each, strict=True)
        return total + sum(self.radix.issued(n, r) + _chunks(n) * self.compaction for n, r in pairs)


@dataclass(frozen=True)
class SelectionLoops:
    """select_best's loops in kpool_index_topk's SASS (``selection_loops``), each as instructions."""

    offer: OfferLoops  # the tile loop
    finish_radix: RadixLoops
    finish_compaction: int
    seed_radix: RadixLoops
    # gather_splits, which a row that one block selects never runs: ``publish`` from the first loop after the
    # finish's compaction (the published list's writing) to the end of the list's radix select
    # (``publish_radix``, its m-th largest key's), which every block of a split row runs; ``merge`` from there to
    # the end of the merge's compaction, which the row's last block runs (the heads' writing and the last-block
    # test among it: an upper bound): the merge's threshold, its tile loop (``merge_offer``, an offer loop over
    # the lists' slots), its finish's radix select and compaction. The finish's last instructions and the splits
    # test before that loop stay counted. ``published`` and ``merged`` count them as a trace ran them.
    publish_radix: RadixLoops
    merge_offer: OfferLoops
    merge_finish_radix: RadixLoops
    merge_finish_compaction: int
    merge: int
    publish: int
    # The row's writing (kp::write_expanded_row, after gather_splits, in a row's last block only), loops over its
    # passes of 1,024 columns, the outermost after the merge that store to global memory: ``write`` the general
    # loop (the last); ``write_whole`` the loop before it, where the kernel has one (0: none), over the passes
    # inside the pool columns when a run lies in one pool and one page (kpool and the page size multiples of 4).
    write: int = 0
    write_whole: int = 0

    def static(self) -> int:
        """What the static count holds of these loops (each body once)."""
        return self.offer.loop + self.finish_radix.rounds + self.finish_compaction + self.seed_radix.rounds

    def issued(self, trace: SelectionTrace) -> int:
        """What a thread issues in them over one range the trace describes."""
        total = _streamed(self.offer, self.finish_radix, self.finish_compaction, trace)
        if trace.seeded:
            total += self.seed_radix.issued(0, trace.seed)
        return total

    def published(self, held: int, search: Search | None) -> int:
        """What a thread of a split row's block issues publishing its list of ``held`` keys, the radix select of
        its m-th largest key ``search`` (None: the list holds fewer than m, no search)."""
        searched = 0 if search is None else self.publish_radix.issued(held, search)
        return self.publish - self.publish_radix.rounds + searched

    def merged(self, trace: SelectionTrace) -> int:
        """What a thread of a split row's last block issues merging the lists, the merge's offers and finish as
        ``trace`` ran them (``SplitTrace.merge``)."""
        static = self.merge_offer.loop + self.merge_finish_radix.rounds + self.merge_finish_compaction
        ran = _streamed(self.merge_offer, self.merge_finish_radix, self.merge_finish_compaction, trace)
        return self.merge - static + ran

    def split_issued(self, trace: SplitTrace) -> int:
        """What a thread issues in select_best, the list's publishing and the merge, summed over the blocks of a
        split row as ``trace`` ran them."""
        pairs = zip(trace.blocks, trace.held, trace.published, strict=True)
        blocks = sum(self.issued(block) + self.published(held, search) for block, held, search in pairs)
        return blocks + self.merged(trace.merge)


def _streamed(offer: OfferLoops, finish_radix: RadixLoops, finish_compaction: int, trace: SelectionTrace) -> int:
    """An offer loop's instructions over the trace's tiles and cut-backs, and its finish's cut-back's."""
    total = offer.issued(trace.tiles, trace.cuts, trace.searches())
    if trace.finish is not None:
        total += finish_radix.issued(trace.finish, trace.finish_search) + _chunks(trace.finish) * finish_compaction
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


class _Reading:
    """The loops of one kernel's SASS and what the readings below ask of them."""

    def __init__(self, sass: str) -> None:
        self.code, self.labels = parse_instructions(sass)
        self.spans = loop_spans(self.code, self.labels)

    def size(self, span: Span) -> int:
        return sum(span[0] <= i.address <= span[1] for i in self.code)

    def barriers(self, span: Span) -> int:
        return sum(span[0] <= i.address <= span[1] and i.opcode[0] == "BAR" for i in self.code)

    def stores(self, span: Span) -> int:
        """Its stores to global memory (STG)."""
        return sum(span[0] <= i.address <= span[1] and i.opcode[0] == "STG" for i in self.code)

    def loads(self, span: Span) -> int:
        """Its loads from global or shared memory (LDG, LDS)."""
        return sum(span[0] <= i.address <= span[1] and i.opcode[0] in ("LDG", "LDS") for i in self.code)

    def within(self, span: Span) -> list[Span]:
        return sorted(s for s in self.spans if _inside(s, span))

    def direct(self, span: Span) -> list[Span]:
        """The loops inside ``span`` and inside no other loop there."""
        inner = self.within(span)
        return [s for s in inner if not any(_inside(s, o) for o in inner)]

    def partial_loads(self, loop: Span) -> list[Span]:
        """The blocks of ``loop`` that load global memory 4 bytes at a time where the loop also loads 16 bytes at
        once (LDG.128): a group of 4 that the range ends inside, the scalar path of a row's last tile, where
        every whole group of an aligned row loads at once (kpool_index_topk's loader). None where the loop
        makes no 16-byte load."""
        loads = [i for i in self.code if loop[0] <= i.address <= loop[1] and i.opcode[0] == "LDG"]
        if not any("128" in i.opcode for i in loads):
            return []
        spans = []
        for start, end, _ in basic_blocks(self.code, self.labels):
            block = self.code[start:end]
            first, last = block[0].address, block[-1].address
            if loop[0] <= first <= loop[1] and any(i.opcode[0] == "LDG" and "128" not in i.opcode for i in block):
                spans.append((first, last))
        return spans

    def radix(self, rounds: Span) -> RadixLoops:
        inner = self.within(rounds)
        if len(inner) > 1:
            raise ValueError(f"the rounds loop at {rounds[0]:#x} holds {len(inner)} loops, not one")
        if not inner:
            return RadixLoops(self.size(rounds), 0)
        histogram = inner[0]
        # A trip loads one buffer key (LDS) and votes once in add_to_histogram (VOTE.ALL: do its counting lanes
        # share a digit); the two counts agree where the body holds whole trips.
        body = [i for i in self.code if histogram[0] <= i.address <= histogram[1]]
        votes = sum(i.opcode[:2] == ("VOTE", "ALL") for i in body)
        if votes < 1 or votes != sum(i.opcode[0] == "LDS" for i in body):
            raise ValueError(f"the histogram loop at {histogram[0]:#x} holds no whole trips")
        return RadixLoops(self.size(rounds), self.size(histogram), votes)

    def offer(self, loop: Span) -> OfferLoops:
        """The offer loop ``loop``: it holds a radix select's rounds loop (around its histogram loop) and a
        compaction loop (a barrier, no loop)."""
        inner = self.within(loop)
        rounds = [s for s in inner if self.within(s)]
        compaction = [
            s for s in inner if not self.within(s) and not any(_inside(s, r) for r in rounds) and self.barriers(s)
        ]
        if len(rounds) != 1 or len(compaction) != 1:
            raise ValueError(f"the loop at {loop[0]:#x} holds {len(rounds)} rounds and {len(compaction)} compaction")
        partial = self.partial_loads(loop)
        path = longest_path(self.code, self.labels, loop, inner + partial)
        round_barriers = self.barriers(rounds[0]) - sum(self.barriers(s) for s in self.within(rounds[0]))
        in_inner = sum(self.size(s) for s in self.direct(loop)) + sum(self.size(s) for s in partial)
        return OfferLoops(
            self.size(loop),
            len(path),
            self.size(loop) - len(path) - in_inner,
            self.radix(rounds[0]),
            self.size(compaction[0]),
            (sum(i.opcode[0] == "BAR" for i in path), round_barriers, self.barriers(compaction[0])),
        )


def selection_loops(sass: str) -> SelectionLoops:
    """select_best's loops in ``sass`` (kpool_index_topk's): the tile loop, the kernel's largest (or the one loop
    directly inside it: that one offers a range again), is an offer loop (``_Reading.offer``); the seed's rounds
    loop is the last loop with a barrier before it; after it the outermost loops with a barrier are the finish's
    rounds and compaction, then gather_splits's: the published list's radix select, the merge's tile loop, its
    finish's rounds and compaction; after those, the row's writing. A ValueError where the code has another
    shape."""
    reading = _Reading(sass)
    spans, within = reading.spans, reading.within
    tile = max(spans, key=reading.size)
    while len(direct := reading.direct(tile)) == 1:  # select_best's loop that offers the range again holds it
        tile = direct[0]
    seed = [s for s in spans if s[1] < tile[0] and reading.barriers(s)]
    outermost = [s for s in sorted(spans) if not any(_inside(s, o) for o in spans)]
    after = [s for s in outermost if s[0] > tile[1] and reading.barriers(s)]
    shape = [bool(within(s)) for s in after[:6]]
    if not seed or shape != [True, False, True, True, True, False]:
        raise ValueError(f"no seed before the tile loop, or not the finish and the merge after it: {shape}")
    finish, finish_compaction = after[0], after[1]
    return SelectionLoops(
        reading.offer(tile),
        reading.radix(finish),
        reading.size(finish_compaction),
        reading.radix(max(seed)),
        reading.radix(after[2]),
        reading.offer(after[3]),
        reading.radix(after[4]),
        reading.size(after[5]),
        sum(after[2][1] < i.address <= after[5][1] for i in reading.code),
        sum(_first_loop_after(spans, finish_compaction[1]) <= i.address <= after[2][1] for i in reading.code),
        *_writing(reading, [s for s in outermost if s[0] > after[5][1] and reading.stores(s)]),
    )


def _writing(reading: _Reading, loops: list[Span]) -> tuple[int, int]:
    """``SelectionLoops.write`` and ``.write_whole`` from the loops that store after the merge, in order: those
    that also load (a run's pool ids, its table entries) write the row's passes; the one that loads nothing is
    COMPACT's fill of -1 after the valid entries, which the static count holds once."""
    passes = [s for s in loops if reading.loads(s)]
    if len(passes) not in (1, 2):
        raise ValueError(f"{len(passes)} loops write a row's passes after the merge, not one or two")
    return reading.size(passes[-1]), reading.size(passes[0]) if len(passes) == 2 else 0


def _first_loop_after(spans: list[Span], address: int) -> int:
    return min(s[0] for s in spans if s[0] > address)


def offer_loop_span(sass: str, outer: Span) -> Span | None:
    """The fused select's offer loop, the largest loop inside ``outer`` (its chunk loop) that meets a barrier and
    holds no tensor-core instruction (its loop over a chunk's tokens, each token's offer and cut-back); None for
    none."""
    return _offer_span(_Reading(sass), outer)


def _offer_span(reading: _Reading, outer: Span) -> Span | None:
    candidates = [
        s
        for s in reading.spans
        if _inside(s, outer)
        and reading.barriers(s)
        and not any(s[0] <= i.address <= s[1] and i.opcode[0] in TENSOR_CORE for i in reading.code)
    ]
    return max(candidates, key=reading.size, default=None)


def offer_loop_within(sass: str, outer: Span) -> OfferLoops:
    """The fused select's offer loop inside ``outer`` (``offer_loop_span``), read as an offer loop."""
    reading = _Reading(sass)
    span = _offer_span(reading, outer)
    if span is None:
        raise ValueError(f"no offer loop inside the loop at {outer[0]:#x}")
    return reading.offer(span)
