"""Print docs/benchmarks.md's model table: what each benchmarked kernel launch should take on an H200, from static
counts.

    python scripts/bench_model.py            # the markdown table
    python scripts/bench_model.py --check    # exit 1 if docs/benchmarks.md holds another one

A prediction, not a measurement. Each row is one launch the benchmark makes,
found by running the op's own call flow on host arrays of the benchmark's
shapes, dtypes and alignment with a backend that records the launch instead of
running it (so the variant is the one launched: index types, VECTOR, TARGET;
the scorer's rows once more for the sm_90a build, wgmma, beside sm_90's).
From that variant's sm_90 SASS (sm_90a for those; `kpool-cupy ptx --sass`) and ptxas's registers
come four bounds, and the prediction is the slowest of them plus a launch:

    memory    bytes / min(4.8 TB/s, bytes in flight / DRAM latency)     (Little's law)
              bytes in flight = resident blocks * threads a block * bytes a thread has outstanding
              resident blocks = min(grid, SMs * blocks_per_sm)
    issue     warps * instructions a thread / (132 SMs * 4 schedulers * 1.98 GHz)
    latency   load_depth * DRAM latency      (round trips a warp waits through one after another, in order)
    predicted launch + max(memory, issue, latency)

The SASS is of the path the bench's data takes where a kernel's text has a
path it never takes: a stored bfloat16 group holding a NaN
(``tools.value_paths``; every bench's values are finite), a run of
``kpool_expand_topk`` across pools or pages (``tools.expand_paths``; the
bench's kpool 4 and pages of 64 make none), and the scorer's of
``tools.scorer_paths``. Code one warp of a block runs alone is charged to
that warp: ``kpool_expand_topk``'s request search (``first_warp_region``,
its loop once a round), over which the block's other warps branch.

A thread's outstanding bytes are the widest set of global loads at one
dependent depth (``tools.load_depth``), a loop's body once. The copy each
measurement is held against is modelled the same way: launch + max(one DRAM
latency, bytes / 4.8 TB/s).
"""

from __future__ import annotations

import functools
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kpool_cupy.backends.host import HostMemory, host_binding  # noqa: E402
from kpool_cupy.bench.backward import backward_bytes, backward_shapes  # noqa: E402
from kpool_cupy.bench.fp8 import (  # noqa: E402
    CACHE_BLOCK_SIZE,
    QUERY_HEADS,
    SLOTS,
    compress_fp8_bytes,
    fp8_cases,
    hadamard_quant_bytes,
    paged_destinations,
    query_batches,
)
from kpool_cupy.bench.index import HEAD_DIM as INDEX_HEAD_DIM  # noqa: E402
from kpool_cupy.bench.index import KPOOL as INDEX_KPOOL  # noqa: E402
from kpool_cupy.bench.index import IndexShape, index_bytes, index_shapes  # noqa: E402
from kpool_cupy.bench.lifecycle import (  # noqa: E402
    BLOCK_SIZE,
    POOL_TOPK,
    DecodeShape,
    expand_bytes,
    paged_inputs,
    step_positions,
    tail_update_bytes,
)
from kpool_cupy.bench.ring_close_fp8 import (  # noqa: E402
    RingCloseShape,
    ring_close_bytes,
    ring_close_fp8_bytes,
    ring_close_fp8_shapes,
)
from kpool_cupy.bench.select import KV_BLOCK_SIZE, select_bytes, select_shapes  # noqa: E402
from kpool_cupy.bench.select import POOL_TOPK as SELECT_TOPK  # noqa: E402
from kpool_cupy.bench.shapes import BenchShape, minimum_bytes, sweep  # noqa: E402
from kpool_cupy.bench.tail_fp8 import BATCHES, STEPS, tail_fp8_bytes  # noqa: E402
from kpool_cupy.bench.topk import topk_bytes, topk_shapes  # noqa: E402
from kpool_cupy.dtypes import element_dtype  # noqa: E402
from kpool_cupy.functions import definition  # noqa: E402
from kpool_cupy.kernel.declarations import (  # noqa: E402
    INDEX_PAIRED_TOKENS,
    MMA_WGMMA,
    builds_for_sm90a,
    tensor_core_for,
)
from kpool_cupy.kernel.geometry import SELECT_CHUNK, WGMMA_ROWS, chunk_members, index_block_pools  # noqa: E402
from kpool_cupy.kernel.sources import kernel_source  # noqa: E402
from kpool_cupy.ops import (  # noqa: E402
    COMPRESS,
    COMPRESS_BACKWARD,
    COMPRESS_FP8,
    EXPAND_TOPK,
    HADAMARD_QUANT_FP8,
    INDEX_LOGITS_FP8,
    INDEX_SELECT_FP8,
    INDEX_TOPK,
    RING_CLOSE,
    RING_CLOSE_FP8,
    TAIL_UPDATE,
    TAIL_UPDATE_FP8,
)
from kpool_cupy.ops.framework.binding import bind  # noqa: E402
from kpool_cupy.ops.framework.spec import Launch, OpSpec  # noqa: E402
from kpool_cupy.ops.index_topk import TOPK_TILE, index_topk_workspace_bytes  # noqa: E402
from kpool_cupy.pool_offsets import pool_row_offsets  # noqa: E402
from kpool_cupy.tools.expand_paths import whole_runs_code  # noqa: E402
from kpool_cupy.tools.load_depth import TENSOR_CORE, load_depth  # noqa: E402
from kpool_cupy.tools.sass import (  # noqa: E402
    branch_target,
    innermost_loops,
    loop_spans,
    parse_instructions,
    summarize_code_sass,
)
from kpool_cupy.tools.sass_report import blocks_per_sm  # noqa: E402
from kpool_cupy.tools.scorer_paths import chunk_rule_code, engine_path_code  # noqa: E402
from kpool_cupy.tools.selection_cost import (  # noqa: E402
    OfferLoops,
    SelectionLoops,
    offer_loop_span,
    offer_loop_within,
    selection_loops,
)
from kpool_cupy.tools.selection_trace import (  # noqa: E402
    SelectionTrace,
    SplitTrace,
    trace_fused_select,
    trace_select_best,
    trace_split_row,
)
from kpool_cupy.tools.value_paths import finite_values_code  # noqa: E402

# NVIDIA's H200 SXM figures (public specification): 4.8 TB/s of HBM3e, 132 SMs, 1.98 GHz boost clock; each SM
# issues one warp-instruction per clock on each of its four schedulers.
BANDWIDTH = 4.8e12  # bytes/s
SMS = 132
ISSUE_RATE = SMS * 4 * 1.98e9  # warp-instructions/s
# An assumption, not an H200 measurement: a global load that misses L2 takes about 600 ns on Hopper. Public
# pointer-chasing microbenchmarks of the H100 (Chips and Cheese, "Nvidia's H100: Funny L2, and Tons of
# Bandwidth", 2023; Luo et al., "Benchmarking and Dissecting the Nvidia Hopper GPU Architecture", 2024)
# put it in the 500-600+ ns range; the upper end is taken, the benchmark's inputs rotating out of L2.
DRAM_LATENCY = 600e-9  # s
# An assumption, not a measurement: the gap one kernel node adds when a CUDA graph replays many launches
# back to back (the benchmark times graph replays), taken as 1 µs.
LAUNCH_US = 1.0
# A warpgroup's chains of 64 pools a chunk in the fused select's sm_90a path (its two warpgroups split a chunk;
# kernels/kpool_index_select.cu's kChains).
WGMMA_SELECT_CHAINS = SELECT_CHUNK // 2 // WGMMA_ROWS
# The scorer's path on an H200's plain sm_90 build (MMA_E4M3_HMMA: f16 mma.sync on converted e4m3).
SM90_MMA = tensor_core_for(90)
BEGIN, END = "<!-- model table: scripts/bench_model.py -->", "<!-- end of model table -->"


class Recorder(HostMemory):
    """A backend that keeps each launch an op asks for and runs none: the launched variant, without a GPU. Its
    device's tensor-core path is ``mma`` (the scorer's on sm_90 unless told)."""

    def __init__(self, mma: int = SM90_MMA) -> None:
        self.launches: list[Launch] = []
        self.mma = mma

    def launch(self, launch: Launch) -> None:
        self.launches.append(launch)

    def tensor_core(self) -> int:
        return self.mma


_RECORDERS = {SM90_MMA: Recorder(), MMA_WGMMA: Recorder(MMA_WGMMA)}
_RECORDING: dict[tuple[str, int], Any] = {}  # each op bound once onto each recorder, by the op's name and path


def launches(spec: OpSpec, *arrays: Any, mma: int = SM90_MMA, **keywords: Any) -> list[Launch]:
    """The launches ``spec``'s op makes for this call (validate=False, as the benchmark calls it) on a device
    whose scorer takes ``mma``, in order."""
    recorder = _RECORDERS[mma]
    if (spec.name, mma) not in _RECORDING:
        binding = host_binding("model", lambda extras: recorder)
        _RECORDING[(spec.name, mma)] = bind(definition(spec), binding, spec)
    function = _RECORDING[(spec.name, mma)]
    recorder.launches.clear()
    function(*arrays, validate=False, **keywords)
    return list(recorder.launches)


def launched(spec: OpSpec, *arrays: Any, mma: int = SM90_MMA, **keywords: Any) -> Launch:
    """The one launch ``spec``'s op makes for this call."""
    made = launches(spec, *arrays, mma=mma, **keywords)
    if len(made) != 1:
        raise ValueError(f"Invalid call of {spec.name}: expected one launch, got {len(made)}")
    return made[0]


def device_like(shape: tuple[int, ...], dtype: Any, fill: Any = None) -> np.ndarray:
    """A host array at a 256-byte aligned address, as CuPy's allocator places device arrays."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize + 256, np.uint8)
    skip = -raw.ctypes.data % 256
    array = raw[skip : skip + count * dtype.itemsize].view(dtype).reshape(shape)
    if fill is not None:
        array[...] = fill
    return array


@dataclass(frozen=True)
class Case:
    """One benchmarked launch: its family, its shape's name, the bytes the benchmark credits it with."""

    family: str
    shape: str
    nbytes: int
    launch: Launch
    kpool: int = 0  # the pool width a streamed pool's loop runs over (compress family), 0 for none
    member_bytes: int = 0
    repeats: int = 0  # times a thread runs its longest loop (the scorer: its walk's steps), 0: once at most
    mma_repeats: int = 0  # times it runs the innermost loop around its first mma (the scorer: every head tile)
    chain_repeats: int = 0  # further runs of the chain step (the innermost loop around the first mma with a barrier)
    chain_token_repeats: int = 0  # further runs of the chain step's token loop (a token more in the step)
    calls: int = 0  # calls a thread makes in the call loop (the largest loop around the first mma with no barrier)
    head_repeats: int = 0  # further runs of the innermost loop around the first mma (the fused select's heads)
    token_repeats: int = 0  # further runs of the call loop's token loop (the fused select's mma.sync: a token more)
    offer_repeats: int = 0  # further runs of the chunk loop's offer loop (the fused select: a token more)
    finish_repeats: int = 0  # further runs of the loop over a block's tokens after its chunks (a token more)
    # The loop `repeats` counts: the longest, or the one just inside the outermost around the first mma (the fused
    # select's chunk loop: the outermost is its loop over a group's runs, which holds once a run what a chunk does
    # not take; its per-token finish, merge and row writing outgrow both)
    repeated_loop: str = "longest"
    # The SASS counted: the kernel's whole text, or (the scorer) its engine path (tools/scorer_paths.py: the bench's
    # tiles hold one request's tokens, its batches at most 512 requests, its pages 64 pools; on sm_90a its chunks
    # of 64 heads full where its heads are a multiple of 64, else part full)
    engine_path: bool = False
    # kpool_index_topk: what select_best did on the benchmark's logits in a sample of its blocks (a row each),
    # its tile loop, cut-backs and radix selects counted as they ran (tools/selection_cost.py); where a row is
    # split over blocks, what its blocks did on a sample of rows (``split_traces``: select_best, each list's
    # publishing and the merge)
    traces: tuple[SelectionTrace, ...] = ()
    split_traces: tuple[SplitTrace, ...] = ()
    # kpool_index_select_fp8: what a token's selection did in a block on the benchmark's logits (TRACED_ROWS
    # rows, each a block's share of a token's row), its offers and cut-backs counted as they ran for each of
    # the block's `offer_tokens` tokens (in place of the offer loop's body once a chunk and a further token)
    offer_traces: tuple[SelectionTrace, ...] = ()
    offer_tokens: int = 0
    # kpool_expand_topk: the rounds of the request search, which the block's first warp alone runs
    # (``first_warp_region``: its span of the text, the loop inside it once a round, the other warps branching
    # over it); 0 where no warp runs it (rows without a table or a tail); None: every warp counted the whole text
    first_warp_search: int | None = None


def _compress_operands(shape: BenchShape) -> dict[str, Any]:
    """The compress sweep's operands (bench.inputs.make_input_sets): int32 offsets and cache lengths, the pool
    offsets int64."""
    dtype = element_dtype(shape.dtype)
    offsets = np.concatenate([[0], np.cumsum(shape.lengths)]).astype(np.int64)
    cache = np.asarray(shape.cache, dtype=np.int64)
    pools = pool_row_offsets(offsets, cache, shape.kpool)
    return {
        "k": device_like((shape.tokens, shape.head_dim), dtype),
        "gate": device_like((shape.tokens, shape.head_dim), dtype),
        "ape": device_like((shape.kpool, shape.head_dim), np.float32),
        "input_row_offsets": device_like(offsets.shape, np.int32, offsets),
        "cache_lengths": device_like(cache.shape, np.int32, cache),
        "pool_row_offsets": device_like(pools.shape, np.int64, pools),
    }


def _member_bytes(shape: BenchShape) -> int:
    return 8 * (2 * element_dtype(shape.dtype).itemsize + 4)


def compress_cases() -> list[Case]:
    cases = []
    for shape in sweep():
        a = _compress_operands(shape)
        out = device_like((shape.pools, shape.head_dim), element_dtype(shape.dtype))
        launch = launched(COMPRESS, a.pop("k"), a.pop("gate"), a.pop("ape"), **a, out=out)
        cases.append(Case("compress", shape.name, minimum_bytes(shape), launch, shape.kpool, _member_bytes(shape)))
    return cases


def compress_fp8_cases() -> list[Case]:
    """bench.fp8.bench_compress_fp8: a paged cache through int64 slots or an int32 block table."""
    cases = []
    for shape, target in fp8_cases():
        a = _compress_operands(shape)
        places = paged_destinations(shape, 1, CACHE_BLOCK_SIZE, np.random.default_rng(1))
        cache = device_like((places.pages, CACHE_BLOCK_SIZE, shape.head_dim + 4), np.uint8, 0)
        if target == SLOTS:
            destination = {"slots": device_like(places.slots[0].shape, np.int64, places.slots[0])}
        else:
            destination = {"block_table": device_like(places.tables[0].shape, np.int32, places.tables[0])}
        launch = launched(COMPRESS_FP8, a.pop("k"), a.pop("gate"), a.pop("ape"), **a, cache=cache, **destination)
        name = f"{shape.name} ({target})"
        cases.append(Case("compress_fp8", name, compress_fp8_bytes(shape), launch, shape.kpool, _member_bytes(shape)))
    return cases


def hadamard_cases(head_dim: int = 128) -> list[Case]:
    """bench.fp8.bench_hadamard_quant: a decode step's queries, QUERY_HEADS rows a request, bf16."""
    cases = []
    for batch in query_batches():
        rows = batch * QUERY_HEADS
        x = device_like((rows, head_dim), element_dtype("bfloat16"))
        values, scales = device_like((rows, head_dim), np.uint8), device_like((rows,), np.float32)
        launch = launched(HADAMARD_QUANT_FP8, x, out=values, out_scale=scales)
        cases.append(Case("hadamard_quant_fp8", f"{batch}x{QUERY_HEADS}", hadamard_quant_bytes(rows, head_dim), launch))
    return cases


def decode_steps() -> list[DecodeShape]:
    """The decode step at every batch and next_n of bench.tail_fp8 (rings of kpool rows)."""
    return [DecodeShape(requests, next_n) for requests in BATCHES for next_n in STEPS]


def _step_operands(shape: DecodeShape) -> dict[str, Any]:
    """bench.lifecycle.bench_tail_update's operands: one input set (int32 positions and slots)."""
    dtype = element_dtype(shape.dtype)
    rows = (shape.requests, shape.next_n, shape.head_dim)
    positions = step_positions(np, np.random.default_rng(0), 1, shape)[0]
    return {
        "tail": device_like((shape.requests, 2, shape.ring, shape.head_dim), dtype),
        "k": device_like(rows, dtype),
        "gate": device_like(rows, dtype),
        "ape": device_like((shape.kpool, shape.head_dim), np.float32),
        "positions": device_like(positions.shape, np.int32, positions),
        "slot_idx": device_like((shape.requests,), np.int32, np.arange(shape.requests)),
        "closed": device_like((shape.requests, shape.pools), np.int32),
    }


def tail_cases() -> list[Case]:
    cases = []
    for shape in decode_steps():
        a = _step_operands(shape)
        out = device_like((shape.requests, shape.pools, shape.head_dim), element_dtype(shape.dtype))
        launch = launched(TAIL_UPDATE, a.pop("tail"), a.pop("k"), a.pop("gate"), a.pop("ape"), **a, out=out)
        cases.append(Case("tail_update", shape.name, tail_update_bytes(shape), launch))
    for shape in decode_steps():
        a = _step_operands(shape)
        values = device_like((shape.requests, shape.pools, shape.head_dim), np.uint8)
        scales = device_like((shape.requests, shape.pools), np.float32)
        arrays = (a.pop("tail"), a.pop("k"), a.pop("gate"), a.pop("ape"))
        launch = launched(TAIL_UPDATE_FP8, *arrays, **a, out=values, out_scale=scales)
        cases.append(Case("tail_update_fp8", shape.name, tail_fp8_bytes(shape), launch))
    return cases


def _close_operands(shape: RingCloseShape) -> tuple[tuple[np.ndarray, ...], dict[str, Any]]:
    """bench.ring_close_fp8's operands: one input set (int32 offsets, lengths and slots)."""
    dtype = element_dtype(shape.dtype)
    requests, kpool, head_dim = shape.requests, shape.kpool, shape.head_dim
    rows = (requests * shape.chunk, head_dim)
    lengths = np.random.default_rng(0).integers(0, 4096, requests) * kpool + shape.from_ring
    arrays = (
        device_like((requests, 2, kpool, head_dim), dtype),
        device_like(rows, dtype),
        device_like(rows, dtype),
        device_like((kpool, head_dim), np.float32),
        device_like((requests + 1,), np.int32, np.arange(requests + 1) * shape.chunk),
        device_like((requests,), np.int32, lengths),
        device_like((requests,), np.int32, np.arange(requests)),
    )
    return arrays, {"closed": device_like((requests,), np.int32)}


def ring_close_cases() -> list[Case]:
    """bench.ring_close_fp8's fused close, and the plain close its unfused sequence starts with (credited with its
    own bytes: bench.ring_close_fp8.ring_close_bytes)."""
    cases = []
    for shape in ring_close_fp8_shapes():
        arrays, a = _close_operands(shape)
        out = device_like((shape.requests, shape.head_dim), element_dtype(shape.dtype))
        launch = launched(RING_CLOSE, *arrays, **a, out=out)
        cases.append(Case("ring_close", shape.name, ring_close_bytes(shape), launch))
        values = device_like((shape.requests, shape.head_dim), np.uint8)
        scales = device_like((shape.requests,), np.float32)
        launch = launched(RING_CLOSE_FP8, *arrays, **a, out=values, out_scale=scales)
        cases.append(Case("ring_close_fp8", shape.name, ring_close_fp8_bytes(shape), launch))
    return cases


def expand_cases(kpool: int = 4) -> list[Case]:
    """bench.lifecycle.bench_expand and bench_expand_paged: int32 ids, offsets and cache lengths."""
    cases = []
    for tokens in (1, 64, 512):
        ids = device_like((tokens, POOL_TOPK), np.int32, 0)
        offsets = device_like((2,), np.int32, [0, tokens])
        launch = launched(EXPAND_TOPK, ids, offsets, device_like((1,), np.int32, 0), kpool=kpool)
        name = f"{tokens}x{POOL_TOPK}"  # no table, no tail: no warp searches
        cases.append(Case("expand_topk", name, expand_bytes(tokens, POOL_TOPK, kpool), launch, first_warp_search=0))
    for tokens in (64, 512):
        chunk, tables = paged_inputs(np, np.random.default_rng(2), 1, tokens, POOL_TOPK, kpool, BLOCK_SIZE)
        ids = device_like(chunk[0].shape, np.int32, chunk[0])
        table = device_like(tables[0].shape, np.int32, tables[0])
        offsets = device_like((tokens + 1,), np.int32, np.arange(tokens + 1))
        cache = device_like((tokens,), np.int32, POOL_TOPK * BLOCK_SIZE - 1)
        launch = launched(EXPAND_TOPK, ids, offsets, cache, kpool=kpool, block_table=table, block_size=BLOCK_SIZE)
        name = f"{tokens}x{POOL_TOPK} paged-{BLOCK_SIZE}"
        nbytes = expand_bytes(tokens, POOL_TOPK, kpool, paged=True)
        cases.append(Case("expand_topk", name, nbytes, launch, first_warp_search=search_rounds(tokens)))
    return cases


def index_cases(heads: int = 64, mma: int = SM90_MMA) -> list[Case]:
    """bench.index.bench_index_logits at ``heads`` heads: its cache of shuffled pages, e4m3 queries, int32 indices,
    a logits row of every pool the request's last token sees; on the path ``mma`` (MMA_WGMMA: the sm_90a build,
    the bench's kpool-cupy-sm90a)."""
    return [scorer_case(shape, mma) for shape in index_shapes() if shape.heads == heads]


def scorer_arrays(shape: IndexShape) -> tuple[np.ndarray, ...]:
    """The scorer's operands at ``shape`` as the index and select benchmarks make them: e4m3 queries, float32
    weights, a paged cache with its table (each request's pages in order), int32 offsets and cache lengths."""
    pages = shape.requests * shape.columns
    q = device_like((shape.tokens, shape.heads, INDEX_HEAD_DIM), np.uint8, 0)
    weights = device_like((shape.tokens, shape.heads), np.float32, 1)
    cache = device_like((pages, CACHE_BLOCK_SIZE, INDEX_HEAD_DIM + 4), np.uint8)
    table = device_like((shape.requests, shape.columns), np.int32, np.arange(pages).reshape(shape.requests, -1))
    offsets = device_like((shape.requests + 1,), np.int32, np.arange(0, shape.tokens + 1, shape.next_n))
    lengths = device_like((shape.requests,), np.int32, shape.context - shape.next_n)
    return q, weights, cache, table, offsets, lengths


def scorer_case(shape: IndexShape, mma: int, family: str = "index_logits_fp8") -> Case:
    """kpool_index_logits_fp8 at ``shape`` as the index and select benchmarks call it (``max_pools`` and ``out``
    given), on the path ``mma``."""
    heads = shape.heads
    out = device_like((shape.tokens, shape.pools), np.float32)
    arrays = scorer_arrays(shape)
    launch = launched(INDEX_LOGITS_FP8, *arrays, mma=mma, kpool=INDEX_KPOOL, max_pools=shape.pools, out=out)
    # A warp's walk: steps of its key tiles, each scoring the tile's tokens a head tile at a time (16 heads
    # on mma.sync, an M-tile of 64 on wgmma).
    steps = launch.values["pools_per_block"] // index_block_pools(INDEX_HEAD_DIM, mma)
    rows = 64 if mma == MMA_WGMMA else 16
    head_tiles = launch.values["tokens_per_block"] * -(-heads // rows) * steps
    family = f"{family} sm_90a" if mma == MMA_WGMMA else family
    per_request = shape.requests == 1 or shape.next_n % launch.values["tokens_per_block"] == 0  # tiles in one
    assert per_request and shape.requests <= 512 and CACHE_BLOCK_SIZE % 64 == 0, shape  # the engine path
    return Case(family, shape.name, index_bytes(shape), launch, repeats=steps, mma_repeats=head_tiles, engine_path=True)


def select_cases(mma: int = SM90_MMA) -> list[Case]:
    """bench.select.bench_select: the fused call and the two-step's scorer on the path ``mma``, and (on sm_90's path
    only: the top-k has no other) the two-step's kpool_index_topk, at its shapes. The loop of a chunk of 1024 candidates
    (scored and offered: the loop just inside the outermost around the fused call's first mma; read and offered:
    kpool_index_topk's longest) counted once a chunk a block (a seed pass's chunk too): the same upper bound as the
    scorer's. Inside the fused call's chunk loop, what runs more than its body holds once is counted as often as it
    runs: on mma.sync the call loop's further trips, each call's token loop once more for each further token of the
    group and its loop over 16 heads once more for each further 16 heads of a token; on the wgmma path the chain step
    (the innermost loop around the first mma that meets a barrier) 7 times more a chunk, its token loop once more a
    chain for each further token (each further pair, where tokens go two to a chain); on both the loop over a block's
    tokens after its chunks once more for each further token, and each token's offers (the chunk loop's largest loop
    with a barrier and no mma) as a trace of its selection ran them (offer_traces), in place of that loop's body once a
    chunk and further token."""
    cases = []
    for shape in select_shapes():
        arrays = scorer_arrays(shape)
        *_, offsets, lengths = arrays  # the top-k of the two-step takes these too
        kv_columns = -(-shape.context // KV_BLOCK_SIZE)
        kv = device_like((shape.requests, kv_columns), np.int32, 0)
        paged = {"block_table": kv, "block_size": KV_BLOCK_SIZE}
        chunks = -(-shape.pools // 1024)
        launch = launched(INDEX_SELECT_FP8, *arrays, mma=mma, kpool=INDEX_KPOOL, pool_topk=SELECT_TOPK, **paged)
        splits, group = int(launch.values["splits"]), int(launch.values["group_tokens"])
        # A block's passes: its split's chunks, and first the seed's (as many as hold pool_topk) where its token
        # has 3 times their worth of them or more (kernels/kpool_index_select.cu's kSeedChunks).
        block_chunks = -(-chunks // splits)
        seed_chunks = -(-SELECT_TOPK // 1024)
        if min(block_chunks * 1024, shape.pools) >= 3 * seed_chunks * 1024:
            block_chunks += seed_chunks
        repeats = block_chunks
        wgmma = mma == MMA_WGMMA
        family = "index_select_fp8 sm_90a" if wgmma else "index_select_fp8"
        chain_steps = block_chunks * (WGMMA_SELECT_CHAINS - 1) if wgmma else 0
        # Its token loop runs a token at a time, or two (INDEX_PAIRED_TOKENS: at most 32 heads, two to a chain).
        paired = bool(launch.template["VECTOR"] & INDEX_PAIRED_TOKENS)
        chain_tokens = block_chunks * WGMMA_SELECT_CHAINS * (-(-group // (2 if paired else 1)) - 1) if wgmma else 0
        # mma.sync: a warp's calls a chunk (kCalls: 8 NT pools each of its 128; the scorer's block of 4 warps
        # takes 4 x 8 NT) and a call's groups of 16 heads a token (kp::score_token's loop), each counted once in
        # the chunk's loop.
        calls = 0 if wgmma else SELECT_CHUNK // 8 // (index_block_pools(INDEX_HEAD_DIM, mma) // 4)
        head_groups = -(-shape.heads // 16)
        # A group's further tokens: each its offer of every chunk and (mma.sync) its run of every call's token loop.
        # The offers a token makes: its rows' chunks of the block's split, seeded as the kernel seeds them.
        width = min(shape.pools, -(-chunks // splits) * 1024)
        rows = [np.random.default_rng(seed).standard_normal(width).astype(np.float32) for seed in range(TRACED_ROWS)]
        cap = int(launch.template["CAP"])
        offers = tuple(trace_fused_select(row, SELECT_TOPK, cap) for row in rows)
        fused = Case(family, shape.name, select_bytes(shape), launch, repeats=repeats,
                     repeated_loop="chunk around first mma", chain_repeats=chain_steps,
                     chain_token_repeats=chain_tokens, calls=repeats * calls,
                     head_repeats=repeats * calls * group * (head_groups - 1),
                     token_repeats=repeats * calls * (group - 1),
                     offer_repeats=repeats * (group - 1), finish_repeats=group - 1,
                     offer_traces=offers, offer_tokens=group)  # fmt: skip
        # The two-step's scorer on the same build (its logits written, as the record's two calls write them).
        two_step_scorer = scorer_case(shape, mma, family="index_logits_fp8 two-step")
        if wgmma:
            cases += [fused, two_step_scorer]
            continue
        cases.append(two_step_scorer)
        logits = device_like((shape.tokens, shape.pools), np.float32)  # never touched: no host pages
        launch = launched(INDEX_TOPK, logits, offsets, lengths, kpool=INDEX_KPOOL, pool_topk=SELECT_TOPK, **paged)
        nbytes = shape.tokens * (shape.pools + SELECT_TOPK * INDEX_KPOOL) * 4  # the logits read, positions written
        cases += [fused, topk_case(shape.name, nbytes, launch, shape.pools)]
    return cases


# Rows whose selection a topk row's prediction averages: the benchmark's logits are independent standard normal
# draws (bench/topk.py, bench/select.py's scorer output taken as such), so a few rows give the mean of many.
TRACED_ROWS = 4


def topk_case(name: str, nbytes: float, launch: Launch, pools: int, rising: bool = False) -> Case:
    """A kpool_index_topk row, its selection traced on the benchmark's logits: TRACED_ROWS rows of ``pools``
    standard normal logits, or (``rising``) those sorted; select_best over each row where a block holds it
    (``traces``), the row's blocks, lists and merge where it is split (``split_traces``)."""
    splits = launch.geometry.grid // launch.geometry.items
    cap, k = int(launch.template["CAP"]), int(launch.values["pool_topk"])
    rows = [np.random.default_rng(seed).standard_normal(pools).astype(np.float32) for seed in range(TRACED_ROWS)]
    rows = [np.sort(row) if rising else row for row in rows]
    if splits > 1:
        split = tuple(trace_split_row(row, k, splits, TOPK_TILE, cap) for row in rows)
        return Case("index_topk", name, nbytes, launch, split_traces=split)
    traces = tuple(trace_select_best(row, k, TOPK_TILE, cap) for row in rows)
    return Case("index_topk", name, nbytes, launch, traces=traces)


def topk_cases() -> list[Case]:
    """bench.topk.bench_topk: kpool_index_topk alone at the issue's records; select_best's loops counted as they
    ran on the benchmark's logits (topk_case)."""
    cases = []
    for shape in topk_shapes():
        logits = device_like((shape.tokens, shape.pools), np.float32)  # never touched: no host pages
        offsets = device_like((shape.requests + 1,), np.int32, np.arange(0, shape.tokens + 1, shape.next_n))
        lengths = device_like((shape.requests,), np.int32, shape.context - shape.next_n)
        paged = {}
        if shape.paged:
            kv = device_like((shape.requests, -(-shape.context // KV_BLOCK_SIZE)), np.int32, 0)
            paged = {"block_table": kv, "block_size": KV_BLOCK_SIZE}
        workspace = device_like((index_topk_workspace_bytes(shape.tokens, shape.pools, shape.pool_topk),), np.uint8)
        launch = launched(INDEX_TOPK, logits, offsets, lengths, kpool=shape.kpool, pool_topk=shape.pool_topk,
                          workspace=workspace if workspace.shape[0] else None, **paged)  # fmt: skip
        cases.append(topk_case(shape.name, topk_bytes(shape), launch, shape.pools, shape.rising))
    return cases


def backward_cases() -> list[Case]:
    """bench.backward.bench_backward: the backward's pooling kernel (the bytes the benchmark credits the call
    with; its request blocks, which zero the rows in no pool, none here, count as pool blocks) and the sum of ape's
    block partials (the partials read), at its shapes."""
    cases = []
    for shape in backward_shapes():
        rows = (shape.total_tokens, shape.head_dim)
        offsets = np.arange(shape.requests + 1, dtype=np.int64) * shape.tokens
        pools = pool_row_offsets(offsets, np.zeros(shape.requests, np.int64), shape.kpool)
        arrays = (
            device_like((shape.pools, shape.head_dim), ml_dtypes.bfloat16),
            device_like(rows, ml_dtypes.bfloat16),
            device_like(rows, ml_dtypes.bfloat16),
            device_like((shape.kpool, shape.head_dim), np.float32),
            device_like(offsets.shape, np.int32, offsets),
            device_like((shape.requests,), np.int32, 0),
        )
        outputs = {"grad_k": device_like(rows, ml_dtypes.bfloat16), "grad_gate": device_like(rows, ml_dtypes.bfloat16)}
        outputs["grad_ape"] = device_like((shape.kpool, shape.head_dim), np.float32)
        pooling, ape_sum = launches(
            COMPRESS_BACKWARD, *arrays, pool_row_offsets=device_like(pools.shape, np.int32, pools), **outputs
        )
        name = f"{shape.requests}x{shape.tokens}"
        cases.append(Case("compress_backward", name, backward_bytes(shape), pooling, shape.kpool, 64))
        partial_bytes = pooling.values["pool_blocks"] * shape.kpool * shape.head_dim * 4
        cases.append(Case("compress_backward", f"{name} ape sum", partial_bytes, ape_sum))
    return cases


def cases() -> list[Case]:
    """Every benchmarked launch, by kernel family (seed_tail is not benchmarked)."""
    return [
        *compress_cases(),
        *compress_fp8_cases(),
        *hadamard_cases(),
        *tail_cases(),
        *ring_close_cases(),
        *expand_cases(),
        *index_cases(),
        *index_cases(mma=MMA_WGMMA),
        *select_cases(),
        *select_cases(mma=MMA_WGMMA),
        *topk_cases(),
        *backward_cases(),
    ]


def _loops(sass: str) -> tuple[list[int], list[tuple[int, int]]]:
    """The instructions' addresses, and each loop's span (tools/sass.py's ``loop_spans``: a backward branch's
    target to the branch, within the body)."""
    addresses = [int(a, 16) for a in re.findall(r"^\s*/\*([0-9a-f]{4,})\*/", sass, re.MULTILINE)]
    return addresses, loop_spans(*parse_instructions(sass))


def loop_body(sass: str) -> int:
    """Instructions in the longest loop (a streamed pool's member loop, the scorer's walk)."""
    addresses, spans = _loops(sass)
    return max((sum(start <= a <= end for a in addresses) for start, end in spans), default=0)


def first_warp_span(sass: str) -> tuple[int, int] | None:
    """A block's first-warp-only code before its first barrier (kpool_expand_topk's request search, which the
    other warps branch over to that barrier): the longest forward branch that lands at or before the first BAR,
    as (its address, its target's); None without one."""
    return _first_warp_span(*parse_instructions(sass))


def _first_warp_span(instructions: list[Any], labels: dict[str, int]) -> tuple[int, int] | None:
    bar = next((i.address for i in instructions if i.opcode[0] == "BAR"), None)
    if bar is None:
        return None
    spans = [
        (i.address, target)
        for i in instructions
        if i.opcode[0] == "BRA" and (target := branch_target(i, labels)) is not None and i.address < target <= bar
    ]
    return max(spans, key=lambda span: span[1] - span[0]) if spans else None


def first_warp_region(sass: str) -> tuple[int, int]:
    """The instructions strictly inside ``first_warp_span``, and those of the largest loop among them; (0, 0)
    without one."""
    instructions, labels = parse_instructions(sass)
    span = _first_warp_span(instructions, labels)
    if span is None:
        return (0, 0)
    start, end = span
    inside = [i.address for i in instructions if start < i.address < end]
    loops = [(a, b) for a, b in loop_spans(instructions, labels) if start < a and b < end]
    loop = max((sum(a <= x <= b for x in inside) for a, b in loops), default=0)
    return (len(inside), loop)


def search_rounds(batch: int) -> int:
    """Rounds of kp::warp_request_rows over ``batch`` requests: five levels of the binary search a round."""
    levels = max(0, batch - 1).bit_length()
    return -(-levels // 5)


def _spans_around_first_mma(sass: str) -> list[tuple[int, int, int]]:
    """Each loop around the first tensor-core instruction: its instructions, first and last address, innermost
    first."""
    addresses, spans = _loops(sass)
    found = re.search(r"^\s*/\*([0-9a-f]+)\*/\s+(?:@!?P\d\s+)?[HQ]G?MMA\.", sass, re.MULTILINE)
    if found is None:
        return []
    first = int(found.group(1), 16)
    around = [(start, end) for start, end in spans if start <= first <= end]
    return sorted((sum(start <= a <= end for a in addresses), start, end) for start, end in around)


def _loops_around_first_mma(sass: str) -> list[int]:
    """The instructions in each loop around the first tensor-core instruction."""
    return [size for size, _, _ in _spans_around_first_mma(sass)]


def _barriers(sass: str) -> list[int]:
    """The addresses of the block-wide barriers (BAR)."""
    return [int(a, 16) for a in re.findall(r"^\s*/\*([0-9a-f]+)\*/\s+(?:@!?P\d\s+)?BAR\.", sass, re.MULTILINE)]


def _call_span(sass: str) -> tuple[int, int] | None:
    """The first and last address of the fused select's mma.sync call loop: the largest loop around the first
    tensor-core instruction that meets no barrier (the chunk's loop around it meets the selection's)."""
    barriers = _barriers(sass)
    free = [(start, end) for _, start, end in _spans_around_first_mma(sass)
            if not any(start <= b <= end for b in barriers)]  # fmt: skip
    return max(free, key=lambda span: span[1] - span[0]) if free else None


def chain_step_bodies(sass: str) -> tuple[int, int]:
    """The fused select's sm_90a chain step, the innermost loop around the first tensor-core instruction that
    meets a barrier, and the loop it holds around that instruction (its tokens): their instructions, 0 for none."""
    barriers = _barriers(sass)
    inner = 0
    for size, start, end in _spans_around_first_mma(sass):
        if any(start <= b <= end for b in barriers):
            return size, inner
        inner = size
    return 0, 0


def call_loop(sass: str) -> tuple[int, int]:
    """The fused select's mma.sync call loop (_call_span's): its instructions, and the calls a trip (its
    tensor-core instructions over those of the innermost loop around the first, which holds one call's for one
    token and 16 heads; 2 where the loop is unrolled by 2); (0, 1) for none."""
    span = _call_span(sass)
    if span is None:
        return 0, 1
    start, end = span
    _, inner_start, inner_end = _spans_around_first_mma(sass)[0]
    instructions = parse_instructions(sass)[0]
    tensor = [i.address for i in instructions if i.opcode[0] in TENSOR_CORE]
    calls = sum(start <= a <= end for a in tensor) // max(1, sum(inner_start <= a <= inner_end for a in tensor))
    return sum(start <= i.address <= end for i in instructions), max(calls, 1)


def _tensor_loops_in_call(sass: str) -> list[tuple[int, int, int]]:
    """The loops inside the call loop (call_loop's) that hold a tensor-core instruction: instructions, first and
    last address; none where there is no call loop."""
    span = _call_span(sass)
    if span is None or len(_spans_around_first_mma(sass)) < 3:
        return []
    first, last = span
    instructions = parse_instructions(sass)[0]
    tensor = [i.address for i in instructions if i.opcode[0] in TENSOR_CORE]
    inside = []
    for start, end in _loops(sass)[1]:
        if first <= start and end <= last and (start, end) != (first, last) and any(start <= a <= end for a in tensor):
            inside.append((sum(start <= i.address <= end for i in instructions), start, end))
    return inside


def token_loop_body(sass: str) -> int:
    """The fused select's mma.sync token loop: the largest of the call loop's loops around tensor-core
    instructions that no other such loop holds (one a call of a trip: each call's token loop), its instructions;
    0 where there is no call loop. (On the wgmma path call_loop finds a loop of the chain step, which its rows
    count no calls of.)"""
    inside = _tensor_loops_in_call(sass)
    outer = [span for span in inside if not any(o != span and o[1] <= span[1] and span[2] <= o[2] for o in inside)]
    return max((size for size, _, _ in outer), default=0)


def head_loop_body(sass: str) -> int:
    """The fused select's mma.sync loop over a token's groups of 16 heads: the largest of the call loop's loops
    around tensor-core instructions that holds no other such loop, its instructions; 0 for none."""
    inner = set(innermost_loops(*parse_instructions(sass), TENSOR_CORE))
    return max((size for size, start, end in _tensor_loops_in_call(sass) if (start, end) in inner), default=0)


def finish_loop_body(sass: str) -> int:
    """The fused select's loop over a block's tokens after its chunks (each token's last cut-back, the merge of its
    splits, its row written): the largest loop outside the outermost around the first tensor-core instruction;
    0 for none."""
    spans = _spans_around_first_mma(sass)
    if not spans:
        return 0
    _, first, last = spans[-1]
    instructions = parse_instructions(sass)[0]
    sizes = [
        sum(start <= i.address <= end for i in instructions)
        for start, end in _loops(sass)[1]
        if end < first or start > last
    ]
    return max(sizes, default=0)


def offer_loop_body(sass: str) -> int:
    """The fused select's offer loop: the largest loop inside the chunk's loop (chunk_mma_loop_body's) that meets a
    barrier and holds no tensor-core instruction (each token's offer of the chunk, its cut-back inlined); 0 for
    none."""
    spans = _spans_around_first_mma(sass)
    if len(spans) < 2:
        return 0
    _, first, last = spans[-2]  # the loop just inside the outermost around the first mma
    span = offer_loop_span(sass, (first, last))
    return 0 if span is None else sum(span[0] <= i.address <= span[1] for i in parse_instructions(sass)[0])


def mma_loop_body(sass: str) -> int:
    """Instructions in the innermost loop around the first tensor-core instruction (0: none in a loop)."""
    return min(_loops_around_first_mma(sass), default=0)


def chunk_mma_loop_body(sass: str) -> int:
    """Instructions in the loop just inside the outermost around the first tensor-core instruction (the fused
    select's chunk loop inside its loop over runs; the outermost where it is the only one, 0: none in a loop)."""
    loops = sorted(_loops_around_first_mma(sass), reverse=True)
    return loops[1] if len(loops) > 1 else (loops[0] if loops else 0)


_LOAD_BYTES = {"128": 16, "64": 8, "U8": 1, "S8": 1, "U16": 2, "S16": 2}


def outstanding_bytes(sass: str) -> int:
    """The bytes a thread has in flight at once: the widest set of global loads at one dependent depth."""
    depths = load_depth(sass).loads
    code, _ = parse_instructions(sass)
    at_depth: dict[int, int] = defaultdict(int)
    for instruction in code:
        if instruction.address in depths:
            width = next((n for key, n in _LOAD_BYTES.items() if key in instruction.opcode), 4)
            at_depth[depths[instruction.address]] += width
    return max(at_depth.values(), default=0)


@dataclass(frozen=True)
class Variant:
    """What the model reads off one variant's SASS."""

    instructions: int
    loop_body: int
    registers: int
    depth: int
    outstanding: int
    mma_loop_body: int = 0
    shared_bytes: int = 0
    chunk_mma_loop_body: int = 0
    chain_step_body: int = 0
    chain_token_body: int = 0
    call_loop_body: int = 0
    calls_a_trip: int = 1
    token_loop_body: int = 0
    offer_loop_body: int = 0
    head_loop_body: int = 0
    finish_loop_body: int = 0
    selection: SelectionLoops | None = None  # kpool_index_topk's select_best loops
    offer: OfferLoops | None = None  # kpool_index_select_fp8's offer loop
    first_warp: tuple[int, int] = (0, 0)  # kpool_expand_topk's first-warp region and its loop (first_warp_region)


@functools.cache
def variant(
    source: str,
    instance: str,
    arch: str = "sm_90",
    engine_path: bool = False,
    full_chunks: bool | None = None,
    whole_runs: bool = False,
) -> Variant:
    if engine_path:  # the scorer's path the bench takes, its tiles in one page
        code = engine_path_code(one_page=True, full_chunks=full_chunks)
    elif full_chunks is not None:  # the fused select's wgmma path, its head chunks' rule fixed
        code = chunk_rule_code(kernel_source(source), full_chunks)
    elif whole_runs:  # kpool_expand_topk on a row of whole runs
        code = whole_runs_code(kernel_source(source))
    else:
        code = kernel_source(source)
    # Every bench's values are finite: a stored bfloat16 group's NaN path is never taken.
    summary = summarize_code_sass(finite_values_code(code), instance, arch=arch)
    sass = summary.sass
    return Variant(
        summary.instructions,
        loop_body(sass),
        summary.registers,
        load_depth(sass).depth,
        outstanding_bytes(sass),
        mma_loop_body(sass),
        summary.shared_bytes,
        chunk_mma_loop_body(sass),
        *chain_step_bodies(sass),
        *call_loop(sass),
        token_loop_body(sass),
        offer_loop_body(sass),
        head_loop_body(sass),
        finish_loop_body(sass),
        selection_loops(sass) if "kpool_index_topk" in instance else None,
        _fused_offer(sass) if "kpool_index_select_fp8" in instance else None,
        first_warp_region(sass) if "kpool_expand_topk" in instance else (0, 0),
    )


def _fused_offer(sass: str) -> OfferLoops:
    """The fused select's offer loop, inside its chunk loop (the loop just inside the outermost around its first
    tensor-core instruction)."""
    _, first, last = _spans_around_first_mma(sass)[-2]
    return offer_loop_within(sass, (first, last))


@dataclass(frozen=True)
class Prediction:
    resident_blocks: int
    blocks_per_sm: int
    reachable: float  # bytes/s
    memory_us: float
    issue_us: float
    latency_us: float
    predicted_us: float
    copy_us: float
    bound: str

    @property
    def fraction_of_copy(self) -> float:
        return self.copy_us / self.predicted_us


def predict(
    case: Case, v: Variant, *, bandwidth: float = BANDWIDTH, latency: float = DRAM_LATENCY, launch_us: float = LAUNCH_US
) -> Prediction:
    """The four bounds of the module docstring for one launch."""
    geometry = case.launch.geometry
    per_sm = blocks_per_sm(v.registers, geometry.block, shared_bytes=v.shared_bytes + geometry.shared_bytes) or 1
    resident = min(geometry.grid, SMS * per_sm)
    in_flight = resident * geometry.block * v.outstanding
    reachable = min(bandwidth, in_flight / latency) if in_flight else bandwidth
    per_thread = v.instructions
    if case.kpool:
        # Straight-line code runs once per thread. A streamed pool's loop takes
        # the whole chunks after the first; its body is in the static count once.
        chunk = chunk_members(case.kpool, case.member_bytes)
        if chunk < case.kpool:
            per_thread += max(0, (case.kpool - chunk) // chunk - 1) * v.loop_body
    if case.repeats:
        # The longest loop (the scorer's walk, with its token and head loops inside once) once per repeat.
        body = v.chunk_mma_loop_body if case.repeated_loop == "chunk around first mma" else v.loop_body
        per_thread += (case.repeats - 1) * body
    # The fused select's sm_90a chain steps past the one its chunk loop holds, and their tokens past the first.
    per_thread += case.chain_repeats * v.chain_step_body + case.chain_token_repeats * v.chain_token_body
    # Its mma.sync call loop's trips past the one each counted chunk holds (calls_a_trip calls a trip), and their
    # groups of 16 heads past the first.
    if case.calls:
        per_thread += (case.calls // v.calls_a_trip - case.repeats) * v.call_loop_body
    per_thread += case.head_repeats * v.head_loop_body
    # Its further tokens of a group: their runs of the call's token loop, of the chunk's offer loop and of the
    # finish.
    per_thread += case.token_repeats * v.token_loop_body + case.offer_repeats * v.offer_loop_body
    per_thread += case.finish_repeats * v.finish_loop_body
    if case.traces or case.split_traces:
        # select_best's loops as they ran (tools/selection_cost.py), the mean of the traced blocks, in place of
        # their bodies' static once; and gather_splits's: where a block holds a row it returns at once (no list,
        # no merge), where a row is split every block publishes its list and the row's last one merges.
        assert v.selection is not None, case
        splits = geometry.grid // geometry.items
        if case.split_traces:
            issued = sum(v.selection.split_issued(trace) for trace in case.split_traces) / len(case.split_traces)
            issued /= splits
        else:
            issued = sum(v.selection.issued(trace) for trace in case.traces) / len(case.traces)
        per_thread += issued - v.selection.static() - v.selection.publish - v.selection.merge
        # The row's last block writes it, a pass of kExpandSpan (1,024) columns at a time: first the passes
        # inside the pool columns, when a run lies in one pool and one page, in their own loop; the rest in the
        # general loop (each loop's body is in the static count once).
        values = case.launch.values
        width = int(values["width"])
        passes = -(-width // 1024)
        kpool, page = int(values["kpool"]), int(values["block_size"]) if case.launch.template["PAGED"] else 4
        # A compacted row, and a kernel without the loop, take no whole passes.
        takes_whole = v.selection.write_whole and not case.launch.template["COMPACT"] and kpool % 4 == page % 4 == 0
        whole = min(int(values["pool_topk"]) * kpool, width) // 1024 if takes_whole else 0
        per_thread += whole / splits * v.selection.write_whole + (passes - whole) / splits * v.selection.write
        per_thread -= v.selection.write + v.selection.write_whole
    if case.offer_traces:
        # The fused select's offers as they ran for each of its tokens (tools/selection_cost.py), in place of
        # the offer loop's body in each chunk's and each further token's count.
        assert v.offer is not None and v.offer.loop == v.offer_loop_body, case
        issued = sum(v.offer.issued(t.tiles, t.cuts, t.searches()) for t in case.offer_traces) / len(case.offer_traces)
        per_thread += case.offer_tokens * issued - (case.repeats + case.offer_repeats) * v.offer.loop
    if case.mma_repeats:
        # The innermost loop around the first mma (the scorer's head tiles) once more per repeat: with the line
        # above, every path of each loop's body counted as often as the loop runs, an upper bound.
        per_thread += (case.mma_repeats - 1) * v.mma_loop_body
    if case.first_warp_search is not None:
        # The request search: the block's first warp runs its region, the loop inside once a round; the other
        # warps branch over it. per_thread becomes a block's mean over its warps.
        region, loop = v.first_warp
        searched = region + max(0, case.first_warp_search - 1) * loop if case.first_warp_search else 0
        per_thread += searched / -(-geometry.block // 32) - region
    warps = geometry.grid * -(-geometry.block // 32)
    bounds = {
        "memory": case.nbytes / reachable * 1e6,
        "issue": warps * per_thread / ISSUE_RATE * 1e6,
        "latency": v.depth * latency * 1e6,
    }
    bound = max(bounds, key=bounds.__getitem__)
    copy_us = launch_us + max(latency * 1e6, case.nbytes / bandwidth * 1e6)
    return Prediction(
        resident,
        per_sm,
        reachable,
        bounds["memory"],
        bounds["issue"],
        bounds["latency"],
        launch_us + bounds[bound],
        copy_us,
        bound,
    )


def template_arguments(instance: str) -> str:
    return instance[instance.index("<") :].replace("kp::", "").replace("long long", "i64").replace("int", "i32")


def full_chunks(case: Case) -> bool | None:
    """On an sm_90a build's wgmma path, whether the bench's heads fill every chunk the head sums take (64 columns,
    or a paired token's half of 32; ``kp::add_heads``): True; False where they fill none; None (both ways counted)
    where some."""
    template = case.launch.template
    if template.get("MMA") != MMA_WGMMA:
        return None
    width = WGMMA_ROWS // 2 if int(template["VECTOR"]) & INDEX_PAIRED_TOKENS else WGMMA_ROWS
    heads = int(case.launch.values["heads"])
    return True if heads % width == 0 else (False if heads < width else None)


def whole_runs(case: Case) -> bool:
    """Whether every run of ``kpool_expand_topk``'s rows lies in one pool and one page (kpool and the page size
    multiples of 4, no tail columns): the kernel's whole-run path is all it takes."""
    if case.launch.kernel is not EXPAND_TOPK.kernel:
        return False
    values, template = case.launch.values, case.launch.template
    kpool, width = int(template["KPOOL"]), int(values["width"])
    page = int(values["block_size"]) if template["PAGED"] else 4
    return not template["COMPACT"] and kpool % 4 == page % 4 == 0 and width <= int(values["pool_topk"]) * kpool


def row(case: Case) -> str:
    arch = "sm_90a" if builds_for_sm90a(case.launch.template) else "sm_90"
    v = variant(
        case.launch.kernel.source, case.launch.instance, arch, case.engine_path, full_chunks(case), whole_runs(case)
    )
    p = predict(case, v)
    g = case.launch.geometry
    return (
        f"| {case.family} | {case.shape} | `{template_arguments(case.launch.instance)}` | {case.nbytes / 2**20:.2f} | "
        f"{g.grid} x {g.block} | {p.blocks_per_sm} | {v.outstanding} | {p.reachable / 1e12:.2f} | {v.depth} | "
        f"{p.memory_us:.2f} | {p.issue_us:.2f} | {p.latency_us:.2f} | {p.predicted_us:.2f} ({p.bound}) | "
        f"{p.fraction_of_copy:.0%} |"
    )


def table() -> str:
    lines = [
        BEGIN,
        "| kernel | shape | launched variant (template arguments) | MiB moved | grid x block | blocks/SM | "
        "bytes in flight a thread | TB/s reachable | load depth | µs memory | µs issue | µs latency | "
        "predicted µs (bound) | predicted fraction of copy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(row(case) for case in cases()),
        END,
    ]
    return "\n".join(lines)


def main() -> int:
    text = table()
    if "--check" in sys.argv:
        docs = (ROOT / "docs" / "benchmarks.md").read_text()
        found = docs[docs.find(BEGIN) : docs.find(END) + len(END)] if BEGIN in docs else ""
        if found != text:
            print("docs/benchmarks.md's model table differs from scripts/bench_model.py's:\n" + text)
            return 1
        return 0
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
