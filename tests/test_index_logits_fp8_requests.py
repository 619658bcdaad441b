"""kpool_index_logits_fp8 finds its tokens' requests from a tree of the binary search's first steps, read by the
whole block into shared memory (kp::RequestTree): the same request, rows and length as kp::find_request and
kp::request_rows on every input, sorted or garbage, inside the tree's 2^9 requests and past them."""

from __future__ import annotations

import numpy as np
import pytest
from index_cases import index_case

from kpool_cupy import emulate, reference
from kpool_cupy.tools.index_accuracy import index_logits_agree, index_logits_bound

pytestmark = pytest.mark.usefixtures("emulated_scorer_path")  # both paths find requests alike


def _agree(case, **options):
    got = emulate.kpool_index_logits_fp8(*case.args, kpool=case.kpool, **options)
    want = reference.kpool_index_logits_fp8(*case.args, kpool=case.kpool, **options)
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))  # each token placed where the search puts it
    bound = index_logits_bound(*case.args, kpool=case.kpool, max_pools=want.shape[1])
    verdict = index_logits_agree(got, want, bound)
    assert verdict["ok"], verdict
    return got


@pytest.mark.parametrize("batch", [1, 2, 511, 512, 513, 1300])
def test_every_token_finds_its_request_below_and_past_the_trees_reach(batch):
    # One or two tokens a request (some none), short prefixes: 512 requests fill the tree's nine steps; 513 and
    # 1300 take their last steps from global memory.
    rng = np.random.default_rng(batch)
    counts = tuple(int(c) for c in rng.integers(0, 3, size=batch))
    lengths = tuple(int(n) for n in rng.integers(0, 12, size=batch))
    case = index_case(rng, heads=4, head_dim=64, kpool=2, block_size=4, counts=counts, cache_lengths=lengths)
    got = _agree(case)
    assert np.isfinite(got).any()


@pytest.mark.parametrize("batch", [7, 600])
def test_garbage_offsets_land_where_the_binary_search_lands(batch):
    # Unsorted offsets and lengths past the rows, without validation: the tree's walk must take the search's
    # steps exactly, or a token lands in another request than the reference (which runs the search) puts it.
    rng = np.random.default_rng(100 + batch)
    counts = tuple(int(c) for c in rng.integers(1, 3, size=batch))
    case = index_case(rng, heads=4, head_dim=64, kpool=2, block_size=4, counts=counts, cache_lengths=(3,) * batch)
    tokens = int(case.input_row_offsets[-1])
    shuffled = case.input_row_offsets.copy()
    shuffled[1:-1] = rng.permutation(shuffled[1:-1])  # unsorted, the last one kept: every row in range
    case.input_row_offsets = shuffled
    max_pools = int(case.cache_block_table.shape[1] * 4)
    got = _agree(case, validate=False, max_pools=max_pools)
    assert got.shape == (tokens, max_pools)
