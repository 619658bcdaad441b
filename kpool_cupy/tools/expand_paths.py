"""``kpool_expand_topk``'s kernel text (kernels/kpool_expand.cu, inlined) with a run's general path cut out, so
the SASS of what remains is what a row of whole runs takes: every run of kExpandRun columns inside one pool and
one page (kpool and the page size multiples of 4, no tail columns), as the engines' kpool 4 and pages of 64 make
them. ``scripts/bench_model.py`` counts it for the bench's expansion rows."""

from __future__ import annotations

from .scorer_paths import cut_once

WHOLE_RUN = "if (run.one)  // a run in one pool and one page"


def whole_runs_code(code: str) -> str:
    """``code`` with every run taken to be whole: a ValueError unless the text holds the test exactly once (the
    kernel changed and the cut must follow it)."""
    return cut_once(code, WHOLE_RUN, "if (true)  // a run in one pool and one page")
