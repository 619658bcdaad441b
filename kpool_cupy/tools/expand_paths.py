"""``kpool_expand_topk``'s kernel text (kernels/kpool_expand.cu, inlined) with a run's general path cut out, so
the SASS of what remains is what a row of whole runs takes: every run of kExpandRun columns inside one pool and
one page (kpool and the page size multiples of 4, no tail columns), as the engines' kpool 4 and pages of 64 make
them. ``scripts/bench_model.py`` counts it for the bench's expansion rows."""

from __future__ import annotations

WHOLE_RUN = "if (run.one)  // a run in one pool and one page"


def whole_runs_code(code: str) -> str:
    """``code`` with every run taken to be whole: a ValueError unless the text holds the test exactly once (the
    kernel changed and the cut must follow it)."""
    if code.count(WHOLE_RUN) != 1:
        raise ValueError(f"the kernel's text holds {code.count(WHOLE_RUN)} of {WHOLE_RUN!r}, expected 1")
    return code.replace(WHOLE_RUN, "if (true)  // a run in one pool and one page")
