"""The GPU path's host cost: a repeated signature goes straight to its launch plan.

Run through tests/cupy_double/ (CuPy over NumPy, kernels on the emulator), so
what is measured is the package's own Python: calls are counted with
sys.setprofile, never timed. The plan must give what the full path gives,
and must not skip a check a kernel's memory safety relies on.
"""

from __future__ import annotations

import subprocess
import textwrap

import pytest
from double import run_on_double

TIMEOUT_S = 60  # a guard against a hang; one script ran in 1.7 to 3.0 s (two busy cores, 2026-12-03)

_SETUP = textwrap.dedent(
    """
    import dataclasses, sys
    import numpy as np, cupy
    import kpool_cupy
    from kpool_cupy import emulate
    from kpool_cupy.backends import cupy_plans
    from kpool_cupy.dtypes import BFLOAT16

    rng = np.random.default_rng(0)
    lengths, cached = [9, 1, 12, 4], [3, 2, 0, 7]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    cache = np.asarray(cached, np.int32)
    pools = kpool_cupy.pool_row_offsets(offsets, cache, 4)

    def batch(seed):
        r = np.random.default_rng(seed)
        k = r.standard_normal((sum(lengths), 128)).astype(BFLOAT16)
        gate = (3 * r.standard_normal((sum(lengths), 128))).astype(BFLOAT16)
        ape = r.standard_normal((4, 128)).astype(np.float32)
        return k, gate, ape

    def on_device(*arrays):
        return [cupy.asarray(a) for a in arrays]

    def hot_call(k, gate, ape, out):
        return kpool_cupy.kpool_compress(
            k, gate, ape, d_offsets, d_cache, pool_row_offsets=d_pools, out=out, validate=False
        )

    d_offsets, d_cache, d_pools = on_device(offsets, cache, pools)
    """
)


def _run(body: str) -> subprocess.CompletedProcess[str]:
    return run_on_double(_SETUP + textwrap.dedent(body), timeout=TIMEOUT_S)


@pytest.mark.slow
def test_a_hot_compress_makes_at_most_12_python_calls_in_the_package():
    done = _run(
        """
        k, gate, ape = on_device(*batch(1))
        out = cupy.zeros((int(pools[-1]), 128), BFLOAT16)
        hot_call(k, gate, ape, out)  # the first call of the signature makes its plan
        assert len(cupy_plans._plans) == 1
        # The launch stubbed: only the package's own Python is left to count.
        (key, plan), = cupy_plans._plans.items()
        cupy_plans._plans[key] = dataclasses.replace(plan, function=lambda *args, **keywords: None)

        package = kpool_cupy.__path__[0]
        calls = []
        def profile(frame, event, arg):
            name = frame.f_code.co_filename
            if event == "call" and name.startswith(package):
                calls.append(f"{name.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")
        sys.setprofile(profile)
        hot_call(k, gate, ape, out)
        sys.setprofile(None)
        print("calls", len(calls), calls)
        # 11 since 2026-12-07 (16 before: the key's options read through a generator; the overlap rule a function
        # of its own since, shared with checked signatures, the build lookup inline); one to spare.
        assert len(calls) <= 12, calls

        # Control: the same counter sees the full path's calls (a different
        # signature: out one row longer).
        longer = cupy.zeros((int(pools[-1]) + 1, 128), BFLOAT16)
        full = []
        def profile_full(frame, event, arg):
            if event == "call" and frame.f_code.co_filename.startswith(package):
                full.append(frame.f_code.co_name)
        sys.setprofile(profile_full)
        hot_call(k, gate, ape, longer)
        sys.setprofile(None)
        print("full path calls", len(full))
        assert len(full) > 60, len(full)
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "calls" in done.stdout


@pytest.mark.slow
def test_the_plan_gives_the_full_paths_bits_with_new_data_at_new_addresses():
    done = _run(
        """
        for seed in (1, 2, 3):
            host = batch(seed)
            want = emulate.kpool_compress(*host, offsets, cache)
            k, gate, ape = on_device(*host)
            out = cupy.zeros(want.shape, BFLOAT16)
            got = hot_call(k, gate, ape, out)
            assert got is out
            assert np.asarray(got).tobytes() == want.tobytes(), seed
        # One plan served all three calls: same signature, new addresses.
        assert len(cupy_plans._plans) == 1, cupy_plans._plans.keys()
        print("ok")
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok" in done.stdout


def test_a_cupy_stream_is_entered_on_its_device_and_one_of_another_device_refused_plan_or_not():
    # A hostile round's findings (the double now keeps CuPy's rule that a stream is entered only while its own
    # device is current): the call entered a CuPy stream before the arrays' device, so with another device
    # current a valid call raised CuPy's RuntimeError, planned or not; and a plan replayed into a stream of
    # another device, which the full path refuses by name.
    done = _run(
        """
        host = batch(1)
        want = emulate.kpool_compress(*host, offsets, cache)
        k, gate, ape = on_device(*host)
        mine = cupy.cuda.Stream(non_blocking=True)  # device 0's, like the arrays
        with cupy.cuda.Device(1):
            theirs = cupy.cuda.Stream(non_blocking=True)
            for call in range(2):  # the full path, then the plan
                out = cupy.zeros(want.shape, BFLOAT16)
                got = kpool_cupy.kpool_compress(k, gate, ape, d_offsets, d_cache, pool_row_offsets=d_pools,
                                                out=out, validate=False, stream=mine)
                mine.synchronize()
                assert np.asarray(got).tobytes() == want.tobytes(), call
        assert len(cupy_plans._plans) == 1, cupy_plans._plans.keys()
        try:
            kpool_cupy.kpool_compress(k, gate, ape, d_offsets, d_cache, pool_row_offsets=d_pools,
                                      out=cupy.zeros(want.shape, BFLOAT16), validate=False, stream=theirs)
        except ValueError as error:
            assert str(error).startswith("Invalid stream: expected a stream of device 0 like k"), error
        else:
            raise AssertionError("a stream of device 1 was taken for arrays of device 0")
        assert not [e for e in cupy.cuda.launch_log if e[1] == theirs.ptr]
        print("ok")
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok" in done.stdout


def test_without_a_stream_a_call_launches_on_its_arrays_devices_current_stream_plan_or_not():
    # CuPy keeps a current stream a device (the double's arrays are all on device 0): with device 1 current and
    # a stream of its own entered, a call on device 0's arrays launches on device 0's current stream, first its
    # null stream, then one entered on device 0 — on the full path and through its plan.
    done = _run(
        """
        host = batch(1)
        want = emulate.kpool_compress(*host, offsets, cache)
        k, gate, ape = on_device(*host)
        zero = cupy.cuda.Stream(non_blocking=True)
        with cupy.cuda.Device(1):
            one = cupy.cuda.Stream(non_blocking=True)
        for outer in (None, zero):
            for call in range(2):  # the full path (first time round), then the plan
                out = cupy.zeros(want.shape, BFLOAT16)
                logged = len(cupy.cuda.launch_log)
                with outer or cupy.cuda.Stream.null, cupy.cuda.Device(1), one:
                    got = hot_call(k, gate, ape, out)
                launches = [entry[1] for entry in list(cupy.cuda.launch_log)[logged:]]
                assert launches == [(outer or cupy.cuda.Stream.null).ptr], (outer, call, launches)
                (outer or cupy.cuda.Stream.null).synchronize()
                assert np.asarray(got).tobytes() == want.tobytes(), (outer, call)
        assert len(cupy_plans._plans) == 1, cupy_plans._plans.keys()
        print("ok")
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok" in done.stdout


def test_the_null_stream_given_as_stream_replays_its_plan():
    # The review of the stream fix: CuPy's Stream.null (and ptds, and get_current_stream()'s default) have
    # device_id -1, "the current device"; read as a device of its own, every such call missed its plan and
    # took the full path again.
    done = _run(
        """
        from kpool_cupy.backends import cupy as backend
        k, gate, ape = on_device(*batch(1))
        out = cupy.zeros((int(pools[-1]), 128), BFLOAT16)
        full = []
        entered = backend.on_device
        backend.on_device = lambda *a, **kw: full.append(1) or entered(*a, **kw)
        assert cupy.cuda.Stream.null.device_id == -1  # as in CuPy
        for _ in range(4):
            kpool_cupy.kpool_compress(k, gate, ape, d_offsets, d_cache, pool_row_offsets=d_pools, out=out,
                                      validate=False, stream=cupy.cuda.Stream.null)
        assert len(full) == 1 and len(cupy_plans._plans) == 1, (len(full), cupy_plans._plans.keys())
        print("ok")
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok" in done.stdout


@pytest.mark.parametrize(
    ("option", "planned", "refused"),
    [
        ("validate", False, 0),
        ("rotate", False, 0),
        ("total_pools", 1, True),
        ("total_pools", 1, 1.0),
    ],
)
def test_an_option_equal_to_a_planned_one_but_of_another_type_is_refused_plan_or_not(option, planned, refused):
    # A hostile round's finding: plans were keyed by the options' values, and 0 == False, 1 == True == 1.0 in
    # Python, so after a plan a call with validate=0 or total_pools=True replayed where the full path refuses.
    done = _run(
        f"""
        k, gate, ape = on_device(*batch(1))
        n = int(pools[-1])
        options = dict(validate=False)
        options[{option!r}] = {planned!r}
        for _ in range(2):
            kpool_cupy.kpool_compress(k, gate, ape, d_offsets, d_cache, pool_row_offsets=d_pools,
                                      out=cupy.zeros((n, 128), BFLOAT16), **options)
        assert len(cupy_plans._plans) == 1, cupy_plans._plans.keys()
        options[{option!r}] = {refused!r}
        try:
            kpool_cupy.kpool_compress(k, gate, ape, d_offsets, d_cache, pool_row_offsets=d_pools,
                                      out=cupy.zeros((n, 128), BFLOAT16), **options)
        except TypeError as error:
            assert str(error).startswith("Invalid {option}: expected"), error
        else:
            raise AssertionError("{option}={refused!r} was replayed")
        print("ok")
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok" in done.stdout


@pytest.mark.slow
def test_the_plan_keeps_the_overlap_rule_and_a_new_alignment_is_a_new_signature():
    done = _run(
        """
        k, gate, ape = on_device(*batch(1))
        n = int(pools[-1])
        hot_call(k, gate, ape, cupy.zeros((n, 128), BFLOAT16))
        # Same signature (dtype, shape, strides, alignment, device) but `out`
        # is k's own memory: the plan must not launch, the full path refuses.
        aliased = k[:n]
        try:
            hot_call(k, gate, ape, aliased)
        except ValueError as error:
            assert "out" in str(error) and "k" in str(error), error
        else:
            raise AssertionError("an out= inside k was accepted")
        # A view 2 bytes off alignment has the same shape and strides: its
        # own signature (no 16-byte access), and the right bits.
        holder = cupy.zeros((n * 128 + 8,), BFLOAT16)
        shifted = holder[1 : 1 + n * 128].reshape(n, 128)
        got = hot_call(k, gate, ape, shifted)
        want = emulate.kpool_compress(*batch(1), offsets, cache)
        assert np.asarray(got).tobytes() == want.tobytes()
        assert len(cupy_plans._plans) == 2, len(cupy_plans._plans)
        print("ok")
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok" in done.stdout


@pytest.mark.slow
def test_a_call_that_copies_or_allocates_is_never_planned():
    done = _run(
        """
        k, gate, ape = on_device(*batch(1))
        n = int(pools[-1])
        # validate=True copies the offsets to the host and checks them: every
        # call, or a bad offsets array on the second call would pass.
        kpool_cupy.kpool_compress(k, gate, ape, d_offsets, d_cache, pool_row_offsets=d_pools,
                                  out=cupy.zeros((n, 128), BFLOAT16))
        kpool_cupy.kpool_compress(k, gate, ape, d_offsets, d_cache)  # allocates out
        assert len(cupy_plans._plans) == 0, cupy_plans._plans.keys()
        bad = cupy.asarray(np.array([0, 9, 10, 22, 99], np.int32))
        try:
            kpool_cupy.kpool_compress(k, gate, ape, bad, d_cache, pool_row_offsets=d_pools,
                                      out=cupy.zeros((n, 128), BFLOAT16))
        except ValueError as error:
            assert "input_row_offsets" in str(error), error
        else:
            raise AssertionError("validate=True let bad offsets through")
        print("ok")
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok" in done.stdout


@pytest.mark.slow
def test_one_array_passed_as_two_operands_makes_no_plan_that_confuses_them():
    # A first call with k passed as gate too must not leave a plan that later
    # passes k where the gate goes (the hostile review's plan_alias case).
    done = _run(
        """
        k, gate, ape = on_device(*batch(1))
        n = int(pools[-1])
        hot_call(k, k, ape, cupy.zeros((n, 128), BFLOAT16))
        got = hot_call(k, gate, ape, cupy.zeros((n, 128), BFLOAT16))
        want = emulate.kpool_compress(*batch(1), offsets, cache)
        assert np.asarray(got).tobytes() == want.tobytes()
        # An option no plan can be keyed by still gets the package's error.
        try:
            kpool_cupy.kpool_compress(k, gate, ape, d_offsets, d_cache, pool_row_offsets=d_pools,
                                      out=cupy.zeros((n, 128), BFLOAT16), validate=False, out_dtype=["float32"])
        except TypeError as error:
            assert str(error).startswith("Invalid out_dtype"), error
        else:
            raise AssertionError("a list out_dtype was accepted")
        print("ok")
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok" in done.stdout


@pytest.mark.slow
def test_a_decode_step_on_a_split_ring_takes_a_plan_that_keeps_both_rings_apart():
    # SGLang's layout: bf16 keys, float32 gate scores, as a pair of arrays.
    # The plan sees the pair as two operands: it must hand each ring to its
    # own kernel argument and still refuse a gate ring over the key ring.
    done = _run(
        """
        def step(seed):
            r = np.random.default_rng(seed)
            k = r.standard_normal((3, 2, 128)).astype(BFLOAT16)
            gate = (3 * r.standard_normal((3, 2, 128))).astype(np.float32)
            return k, gate

        ape = batch(0)[2]
        rings = lambda: (np.zeros((4, 8, 128), BFLOAT16), np.zeros((4, 8, 128), np.float32))
        positions = np.array([[2, 3], [6, 7], [10, 11]], np.int32)
        slots = np.array([3, 0, 2], np.int32)
        host_rings = rings()
        keys, gates = (cupy.asarray(a) for a in rings())
        d_ape, d_positions, d_slots = on_device(ape, positions, slots)
        for seed in (1, 2, 3):
            k, gate = step(seed)
            want, want_closed = emulate.kpool_tail_update(host_rings, k, gate, ape, positions, slots)
            out, closed = cupy.zeros((3, 1, 128), BFLOAT16), cupy.zeros((3, 1), np.int32)
            d_k, d_gate = on_device(k, gate)
            kpool_cupy.kpool_tail_update((keys, gates), d_k, d_gate, d_ape, d_positions, d_slots,
                                         out=out, closed=closed, validate=False)
            assert np.asarray(out).tobytes() == want.tobytes(), seed
            assert np.asarray(closed).tolist() == want_closed.tolist()
            assert np.asarray(keys).tobytes() == host_rings[0].tobytes()
            assert np.asarray(gates).tobytes() == host_rings[1].tobytes()
        assert len(cupy_plans._plans) == 1, len(cupy_plans._plans)
        # Same signature (shapes, strides, alignment), the key ring now the
        # gate ring's first bytes: the plan must not launch, the full path refuses.
        holder = cupy.zeros((4, 8, 128), np.float32)
        over = holder.view(BFLOAT16).reshape(-1)[: 4 * 8 * 128].reshape(4, 8, 128)
        assert over.strides == keys.strides
        try:
            kpool_cupy.kpool_tail_update((over, holder), d_k, d_gate, d_ape, d_positions, d_slots,
                                         out=out, closed=closed, validate=False)
        except ValueError as error:
            assert str(error).startswith("Invalid tail[0]: expected memory that tail[1]"), error
        else:
            raise AssertionError("overlapping rings were accepted")
        print("ok")
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok" in done.stdout


@pytest.mark.slow
def test_a_call_that_returns_none_replays_to_none_by_its_plans_own_word():
    # A cache form returns None. Its plan said so only because the result's
    # index happened to land on an operand left None; now the plan records
    # that the call returns nothing, and the replay writes what the full call wrote.
    done = _run(
        """
        k, gate, ape = on_device(*batch(1))
        n = int(pools[-1])
        slots = cupy.asarray(np.arange(n, dtype=np.int64))
        def cached_call(cache):
            return kpool_cupy.kpool_compress_fp8(k, gate, ape, d_offsets, d_cache, pool_row_offsets=d_pools,
                                                 cache=cache, slots=slots, validate=False)
        first = cupy.zeros((8, 4, 128 + 4), np.uint8)
        assert cached_call(first) is None
        (plan,) = cupy_plans._plans.values()
        assert plan.results is None, plan.results
        again = cupy.zeros((8, 4, 128 + 4), np.uint8)
        assert cached_call(again) is None
        assert np.asarray(again).tobytes() == np.asarray(first).tobytes() and np.asarray(first).any()
        print("ok")
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok" in done.stdout


def test_a_validated_calls_index_copies_run_nothing_on_the_device_and_wait_for_the_stream_once():
    # backends/cupy.CupyBackend.host_copies: each array copied without waiting into one pinned buffer, then one
    # wait for the current stream. A kernel queued before on that stream writes what the copies must read.
    done = _run(
        """
        from cupy import cuda
        from kpool_cupy.backends.cupy import CupyBackend

        arrays = [
            cupy.asarray(np.arange(5, dtype=np.int32)),
            cupy.asarray(np.array([4_000_000_000, 7], np.uint32)),  # past int32: widened, not wrapped
            cupy.asarray(np.zeros(0, np.int32)),
            cupy.asarray(np.array([-3, 2**40, 9], np.int64)),
        ]
        stream = cuda.Stream(non_blocking=True)
        with stream:
            def write():  # a kernel's work, queued on the stream until something waits for it
                np.asarray(arrays[0])[:] = np.arange(10, 15, dtype=np.int32)
            cuda._enqueue(stream, write, "write")
            operations, waits = [], []
            before_op, wait = cuda._before_array_op, cuda._wait_for
            cuda._before_array_op = lambda: operations.append(1) or before_op()
            cuda._wait_for = lambda s: waits.append(s) or wait(s)  # what every wait of the host comes to
            copies = CupyBackend(cupy, 0).host_copies(arrays)
        assert not operations, operations
        assert len(waits) == 1, waits
        want = [np.arange(10, 15), np.array([4_000_000_000, 7]), np.zeros(0), np.array([-3, 2**40, 9])]
        for got, expected in zip(copies, want, strict=True):
            assert got.dtype == np.int64 and np.array_equal(got, expected), (got, expected)
        print("ok")
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok" in done.stdout


_VALIDATED = """
import kpool_cupy.backends.cupy as gpu_backend

def validated(k, gate, ape, out, offsets=None):
    return kpool_cupy.kpool_compress(k, gate, ape, d_offsets if offsets is None else offsets, d_cache,
                                      pool_row_offsets=d_pools, out=out)
"""


def _run_validated(body: str) -> subprocess.CompletedProcess[str]:
    """``body`` with ``validated(k, gate, ape, out, offsets=None)``: the setup's batch, validate=True."""
    return _run(_VALIDATED + textwrap.dedent(body))


@pytest.mark.slow
def test_a_validated_compress_repeating_a_signature_skips_the_checks_that_read_no_data():
    # Issue 36 (validate=True within 60 us on an H200): a signature's second validated call runs the op's own
    # run (the data checks) after the overlap rule, not the metadata checks again. Counted, launch stubbed.
    done = _run_validated(
        """
        k, gate, ape = on_device(*batch(1))
        out = cupy.zeros((int(pools[-1]), 128), BFLOAT16)
        package = kpool_cupy.__path__[0]
        def counted(call):
            calls = []
            def profile(frame, event, arg):
                if event == "call" and frame.f_code.co_filename.startswith(package):
                    calls.append(frame.f_code.co_name)
            sys.setprofile(profile)
            call()
            sys.setprofile(None)
            return calls
        gpu_backend.launch_function = lambda *args, **keywords: None
        first = counted(lambda: validated(k, gate, ape, out))
        again = counted(lambda: validated(k, gate, ape, out))
        print("calls", len(first), len(again))
        assert "check_compress_args" in first and "check_compress_args" not in again, again
        assert "check_offset_values" in again  # the data's checks run on every validated call
        # 70 on 2026-12-07 (71 once the overlap rule became cupy_plans.may_overlap, shared with the replays, 70
        # again once a kernel cache hit skipped import_cupy;
        # 326 before the checked signatures and the launch's cached declarations, 76 before the offsets' checks
        # computed the pools without pool_row_offsets' argument checks; the first call 336 now); about a tenth
        # to spare.
        assert len(again) <= 77, (len(again), again)
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "calls" in done.stdout


@pytest.mark.slow
def test_a_checked_signature_gives_the_full_paths_bits_and_refusals():
    done = _run_validated(
        """
        from kpool_cupy.backends import cupy_plans
        n = int(pools[-1])
        def refusal(call):
            try:
                call()
            except ValueError as error:
                return str(error)
            raise AssertionError("accepted")

        for seed in (1, 2, 3):  # the first call checks in full, the others skip the checks that read no data
            host = batch(seed)
            got = validated(*on_device(*host), cupy.zeros((n, 128), BFLOAT16))
            assert np.asarray(got).tobytes() == emulate.kpool_compress(*host, offsets, cache).tobytes(), seed
        assert len(cupy_plans._checked) == 1 and not cupy_plans._plans

        k, gate, ape = on_device(*batch(1))
        bad = cupy.asarray(np.array([0, 9, 10, 22, 99], np.int32))  # the same signature as d_offsets
        skipped = refusal(lambda: validated(k, gate, ape, cupy.zeros((n, 128), BFLOAT16), offsets=bad))
        # An output over an input, every array's signature unchanged: out's rows are k's from row 1.
        both = cupy.zeros((sum(lengths) + n, 128), BFLOAT16)
        both[:sum(lengths)] = k
        overlapping = refusal(lambda: validated(both[:sum(lengths)], gate, ape, both[1:n + 1]))
        cupy_plans.forget_all()  # the same two calls through every check
        assert skipped == refusal(lambda: validated(k, gate, ape, cupy.zeros((n, 128), BFLOAT16), offsets=bad))
        assert overlapping == refusal(lambda: validated(both[:sum(lengths)], gate, ape, both[1:n + 1]))
        assert "input_row_offsets" in skipped and overlapping.startswith("Invalid out"), (skipped, overlapping)
        print("ok")
        """
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ok" in done.stdout
