"""The scorer's kernel text (kernels/kpool_index_logits.cu, inlined) with the paths an engine's step never takes
cut out, so the SASS of what remains is the path a decode or prefill step runs.

An engine's step holds one request's tokens in a token tile (a decode tile is a request's next_n tokens, a prefill
one request), and at most 512 requests, so it never takes two paths: a request search step past the 512 the
block's tree holds (a load from global memory), and a tile across requests (the keys of a token of another
request than the tile's first, loaded on the spot). ``one_page`` fixes the sm_90a walk's page rule: True, every
tile in one page (pages of a multiple of 64 pools, as the engines' 64); False, every tile row by row.
``full_chunks`` fixes its rule for a chunk of 64 heads (``kp::add_heads``): True, every chunk full (a multiple of
64 heads, as the engines' 64); False, every chunk part full (fewer than 64, as 32).
"""

from __future__ import annotations

from ..kernel.declarations import INDEX_LOGITS_FP8
from ..kernel.sources import kernel_source

PAST_THE_TREE = (
    "const long long value = held ? tree.offset[node] : load_index(offsets, mid);",
    "const long long length = held ? tree.length[node] : load_index(lengths, mid);",
)
ANOTHER_REQUEST = ("if (scores && request != keys_of) {", "if (scores && spare && request != spare_of) {")
FULL_CHUNK = "if (left >= 8 * (J1 - J0))"
ONE_PAGE = (
    "const bool one_page = kVectorCache && page_size.size % static_cast<unsigned int>(N) == 0u && range_lo % N == 0;"
)


def engine_path_code(one_page: bool | None = None, full_chunks: bool | None = None) -> str:
    """The scorer's whole kernel text without the two paths above, and with the rules asked for fixed (each
    statement found exactly once, else a ValueError: the kernel changed and the cut must follow it)."""
    code = kernel_source(INDEX_LOGITS_FP8.source)
    cuts = [(statement, statement.split(" : ")[0] + " : 0;") for statement in PAST_THE_TREE]
    cuts += [(statement, "if (false) {") for statement in ANOTHER_REQUEST]  # one in each path's body
    if one_page is not None:
        cuts.append((ONE_PAGE, f"const bool one_page = {'kVectorCache' if one_page else 'false'};"))
    for statement, replacement in cuts:
        code = cut_once(code, statement, replacement)
    return code if full_chunks is None else chunk_rule_code(code, full_chunks)


def chunk_rule_code(code: str, full_chunks: bool) -> str:
    """``code`` (a kernel text holding ``kp::add_heads``, inlined: the scorer's or the fused select's) with its rule
    for a chunk of heads fixed: True, every chunk full; False, every chunk part full."""
    return cut_once(code, FULL_CHUNK, f"if ({'true' if full_chunks else 'false'})")


def cut_once(code: str, statement: str, replacement: str) -> str:
    """``code`` with ``statement`` replaced: a ValueError unless the text holds it exactly once (the kernel
    changed and the cut must follow it). Every path cut of tools/ goes through it."""
    if code.count(statement) != 1:
        raise ValueError(f"the kernel's text holds {code.count(statement)} of {statement!r}, expected 1")
    return code.replace(statement, replacement)
