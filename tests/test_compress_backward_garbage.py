"""kpool_compress_backward's garbage family under AddressSanitizer: validate=False never leaves the arrays.

Garbage offsets, cache lengths and pool_row_offsets (tests/garbage.py,
``backward_garbage_cases``), grad_pooled of fewer rows than the pools
claimed and at odd strides, given outputs or not, through the emulated
kernels built with ``-fsanitize=address`` (the harness of
tests/test_emulator_build.py). The default tier runs one call that reaches
the kernels; the sweep is ``slow``.
"""

from __future__ import annotations

import textwrap

import pytest
import sanitized
from sanitized import ROOT

_SANITIZED_BACKWARD_RUN = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from garbage import backward_garbage_cases
    from kpool_cupy import emulate, reference
    from kpool_cupy.emulator.launch import recording

    def short(case):
        # Valid offsets and fewer grad_pooled rows than their pools: only the kernel's row check keeps the
        # pools past grad_pooled from reading past it.
        try:
            reference.kpool_compress_backward(**case)
        except ValueError as error:
            return str(error).startswith("Invalid grad_pooled")
        return False

    kinds = set()  # (streamed, short): the kinds of call that reached the kernels
    for function, case in backward_garbage_cases({seed}, {count}):
        kind = (case["ape"].shape[0] == 9, short(case))
        if {only} is not None and (kind != {only} or kinds):
            continue  # one call of that kind
        with recording() as launches:
            getattr(emulate, function)(**case, validate=False)
        if any(launch.kernel_name.startswith("kpool_compress_backward<") for launch in launches):
            kinds.add(kind)
    print("kinds:", sorted(kinds))
    """
)


def _sanitized(seed: int, count: int, only: tuple[bool, bool] | None):
    libasan = sanitized.libasan()
    if libasan is None:
        pytest.skip("the host compiler has no AddressSanitizer runtime")
    script = _SANITIZED_BACKWARD_RUN.format(tests=str(ROOT / "tests"), seed=seed, count=count, only=only)
    done = sanitized.run(script, libasan)
    assert "AddressSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stderr[-4000:]
    sanitized.assert_instrumented(done.stdout)
    return done.stdout


def test_address_sanitizer_sees_a_garbage_backward_call():
    # The default tier's one call (three instrumented builds, about 10 s): streamed pools (kpool 9, read
    # member by member) of held requests, more of them than grad_pooled has rows (a kernel without its row
    # check reads past grad_pooled here), reaching the kernels.
    stdout = _sanitized(seed=1, count=8, only=(True, True))
    assert "kinds: [(True, True)]" in stdout, stdout


@pytest.mark.slow
def test_address_sanitizer_sees_no_access_outside_the_backward_arrays_on_garbage():
    # 16 garbage calls, every one run (each new variant an instrumented build; about 50 s): held and streamed
    # pools, grad_pooled shorter than valid offsets' pools and not.
    stdout = _sanitized(seed=1, count=16, only=None)
    assert "kinds: [(False, False), (False, True), (True, False), (True, True)]" in stdout, stdout
