"""The emulator's build: compiler discovery, the flags in the cache key, and AddressSanitizer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import sanitized
from model import make_batch

from kpool_cupy import emulate
from kpool_cupy.emulator import toolchain
from kpool_cupy.kernel.sources import kernel_source

ROOT = Path(__file__).resolve().parent.parent


def test_missing_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-kpool")
    with pytest.raises(emulate.CompilerNotFoundError, match="CXX"):
        emulate.kpool_compress(*make_batch([8], [0]).args())


@pytest.mark.parametrize("flag", ["-ffast-math", "-Ofast", "-ffinite-math-only"])
def test_flags_that_change_the_numerics_are_refused(monkeypatch, flag):
    # -ffast-math drops the NaN policy and links crtfastmath, which would set
    # flush-to-zero for the whole Python process, not just a launch.
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, f"-g {flag}")
    with pytest.raises(ValueError, match=rf"^Invalid {emulate.FLAGS_VARIABLE}: .* got {flag} "):
        emulate.kpool_compress(*make_batch([8], [0]).args())


def test_flags_are_part_of_the_cache_key(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    batch = make_batch([8], [0], head_dim=8, kpool=2)
    monkeypatch.delenv(emulate.FLAGS_VARIABLE, raising=False)
    emulate.kpool_compress(*batch.args())
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, "-DKPOOL_TEST_FLAG=1")
    emulate.kpool_compress(*batch.args())
    built = sorted(p.name for p in (tmp_path / "kpool-cupy" / "emulate").glob("*.so"))
    assert len(built) == 2, built


def _gcc() -> str:
    cxx = toolchain.compiler()
    if "Free Software Foundation" not in toolchain._compiler_identity(cxx):
        pytest.skip("the emulator precompiles its headers with GCC only")
    return cxx


def test_a_loaded_variant_is_found_while_another_thread_builds():
    # helper-59's finding: every launch took the build lock, so while one thread built a new variant (g++,
    # seconds) every other thread's launch of a loaded one waited for it. Here the lock is held as a build holds
    # it; a loaded variant must come back at once.

    code, name = (
        kernel_source("kpool_compress.cu"),
        "kpool_compress<kp::bf16, kp::bf16, kp::bf16, 128, 4, 15, 0, int, int, long long>",
    )
    loaded = toolchain.load_code(code, name)
    found: list = []
    with toolchain._build_lock:  # another thread's build
        worker = threading.Thread(target=lambda: found.append(toolchain.load_code(code, name)))
        worker.start()
        worker.join(timeout=10)  # a guard: the lookup takes microseconds
        assert found == [loaded], "a loaded variant waited for another thread's build"


def test_builds_read_the_emulator_headers_precompiled_once_per_flags(monkeypatch, tmp_path):
    cxx = _gcc()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(toolchain, "_loaded", {})  # build, not reuse this process's libraries
    monkeypatch.delenv(emulate.FLAGS_VARIABLE, raising=False)
    for kpool in (2, 3):  # two builds, one precompile
        emulate.kpool_compress(*make_batch([8], [0], head_dim=8, kpool=kpool).args())
    cache = tmp_path / "kpool-cupy" / "emulate"
    assert len(list(cache.glob("*.so"))) == 2
    (compiled,) = cache.glob("emulator-*.h.gch")
    header = compiled.with_suffix("")
    assert header.read_text() == kernel_source(toolchain.EMULATOR_HEADER)
    # GCC takes the .gch under the builds' flags (-H marks a precompiled header it read with "!").
    flags = [*toolchain.BASE_FLAGS, *toolchain.LAST_FLAGS]
    source = tmp_path / "probe.cpp"
    source.write_text(f'#include "{header}"\nint probe() {{ return 0; }}\n')
    done = subprocess.run([cxx, *flags, "-H", "-fsyntax-only", str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"! {compiled}" in done.stderr.splitlines(), done.stderr[:2000]
    # Other flags, another precompile.
    monkeypatch.setenv(emulate.FLAGS_VARIABLE, "-DKPOOL_TEST_FLAG=1")
    emulate.kpool_compress(*make_batch([8], [0], head_dim=8, kpool=2).args())
    assert len(list(cache.glob("emulator-*.h.gch"))) == 2


def test_the_compiler_runs_without_the_processs_preload(monkeypatch, tmp_path):
    # A sanitizer runtime preloaded into Python (the AddressSanitizer runs
    # below) would load into every compiler process and double its time.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(toolchain, "_loaded", {})  # build, not reuse this process's libraries
    monkeypatch.setenv("LD_PRELOAD", "")  # a name the loader skips, present in os.environ
    commands = []
    real_run = subprocess.run

    def recording_run(command, *args, **kwargs):
        commands.append((command, kwargs.get("env")))
        return real_run(command, *args, **kwargs)

    monkeypatch.setattr(toolchain.subprocess, "run", recording_run)
    emulate.kpool_compress(*make_batch([8], [0], head_dim=8, kpool=5).args())
    builds = [(command, env) for command, env in commands if "-o" in command]
    assert builds
    for command, env in builds:
        assert env is not None and "LD_PRELOAD" not in env, command
        assert env.get("XDG_CACHE_HOME") == str(tmp_path)  # the rest of the environment is kept


# A sanitized child's script (tests/sanitized.py): compress, the lifecycle and expand over garbage.
_SANITIZED_RUN = textwrap.dedent(
    """
    import runpy, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from model import make_batch
    from kpool_cupy import emulate
    from kpool_cupy.kernel.declarations import COMPRESS, EXPAND_TOPK, TAIL_UPDATE

    batch = make_batch([13, 0, 7, 9], [0, 3, 2, 5], head_dim=16, kpool=3, seed=1)
    emulate.kpool_compress(*batch.args())
    # A pool_row_offsets entry of INT64_MIN once made pool - begin overflow:
    # with an odd kpool the wrapped row landed just past a 4-row k.
    batch = make_batch([4, 0], [0, 0], head_dim=16, kpool=3, seed=2)
    out = np.zeros((5, 16), batch.k.dtype)
    pools = np.array([0, -(2**63), 100], np.int64)
    emulate.kpool_compress(*batch.args(), pool_row_offsets=pools, out=out, validate=False)
    sys.argv = ["run_garbage.py", "--backend", "emulate", "--count", "{count}", "--families", "compress,lifecycle"]
    try:
        runpy.run_path({runner!r}, run_name="__main__")
    except SystemExit as done:
        assert done.code == 0, done.code
    dt = batch.k.dtype
    name = COMPRESS.instance(KT=dt, GT=dt, OT=dt, HEAD_DIM=16, KPOOL=3)
    ring = TAIL_UPDATE.instance(T=dt, G=dt, OT=dt, HEAD_DIM=16, KPOOL=3)
    paged = EXPAND_TOPK.instance(KPOOL=3, IPID=np.int32, IO=np.uint32, IC=np.int64, PAGED=True, COMPACT=True)
    for source, instance in ((COMPRESS.source, name), (TAIL_UPDATE.source, ring), (EXPAND_TOPK.source, paged)):
        emulate.load_variant(source, instance)  # among the libraries the control reads
    """
)


@pytest.mark.slow
def test_address_sanitizer_sees_no_access_outside_the_arrays_on_garbage():
    # Hundreds of garbage offset sets with validate=False (tests/garbage.py),
    # and expand's garbage block tables and block sizes, compacting or not.
    libasan = sanitized.libasan()
    if libasan is None:
        pytest.skip("the host compiler has no AddressSanitizer runtime")
    script = _SANITIZED_RUN.format(tests=str(ROOT / "tests"), runner=str(ROOT / "tests" / "run_garbage.py"), count=300)
    done = sanitized.run(script, libasan)
    assert "AddressSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stderr[-4000:]
    # 300 compress, 300 lifecycle, 150 expand with a table or compact, 75 lifecycle on split rings.
    assert "garbage calls: 825" in done.stdout
    # Control: the libraries that ran (compress's, tail update's and expand's among them) carry the sanitizer.
    sanitized.assert_instrumented(done.stdout, at_least=3)


# The FP8 family of tests/run_garbage.py on its own: its 40 or so
# instrumented builds (one to two minutes) would take the run above past its
# timeout.
_SANITIZED_FP8_RUN = textwrap.dedent(
    """
    import runpy, sys
    sys.argv = ["run_garbage.py", "--backend", "emulate", "--count", "{count}", "--families", "fp8"]
    try:
        runpy.run_path({runner!r}, run_name="__main__")
    except SystemExit as done:
        assert done.code == 0, done.code
    """
)


@pytest.mark.slow
def test_address_sanitizer_sees_no_access_outside_the_fp8_arrays_on_garbage():
    # kpool_compress_fp8 with garbage slots (-1, other negatives, past the
    # cache, +-2^62, int32 and int64), garbage block tables (negative, past
    # the cache, INT32_MAX, no columns, padded or reversed rows), caches of
    # one page of one entry or with padded pages, out rows fewer than the
    # pools claimed, over garbage offsets; hadamard_quant_fp8 at odd
    # strides (tests/garbage.py, fp8_garbage_cases); ring close and tail
    # update into FP8 rows or a cache over ring and index garbage, on one
    # ring array or a split pair (fp8_ring_garbage_cases).
    libasan = sanitized.libasan()
    if libasan is None:
        pytest.skip("the host compiler has no AddressSanitizer runtime")
    script = _SANITIZED_FP8_RUN.format(runner=str(ROOT / "tests" / "run_garbage.py"), count=120)
    done = sanitized.run(script, libasan)
    assert "AddressSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stderr[-4000:]
    # 50 kpool_compress_fp8, 10 hadamard_quant_fp8, 30 ring close and tail update, 5 each of the scorer, the
    # selection and the fused selection.
    assert "garbage calls: 105" in done.stdout
    # Control: every library that ran was built with the sanitizer.
    sanitized.assert_instrumented(done.stdout, at_least=21)


# One garbage call of the FP8 kernels, expand and the scorer, which between
# them cover every family of kernels/*.cu, under the sanitizer: the default
# tier's AddressSanitizer run, six instrumented builds (about a minute on two
# busy cores); the two runs above are the long sweeps.
_SANITIZED_FAMILIES_RUN = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from garbage import (
        expand_garbage_cases, fp8_garbage_cases, fp8_ring_garbage_cases, index_garbage_cases, select_garbage_cases,
        topk_garbage_cases,
    )
    from kpool_cupy import emulate
    from kpool_cupy.emulator.launch import recording

    cases = [("kpool_expand_topk", case) for case in expand_garbage_cases(0, 6)]
    cases += [*fp8_garbage_cases(0, 12), *fp8_ring_garbage_cases(0, 6), *index_garbage_cases(0, 6)]
    cases += [*topk_garbage_cases(0, 8), *select_garbage_cases(0, 8)]
    launched = set()
    for function, case in cases:
        if function in launched:
            continue  # one call that reaches its kernel per family
        with recording() as launches:
            getattr(emulate, function)(**case, validate=False)
        if launches:
            launched.add(function)
    print("families:", sorted(launched))
    """
)


def test_address_sanitizer_sees_one_garbage_call_of_each_kernel_family():
    # compress (its FP8 form: the pooling and the sink), ring (ring close's
    # and tail update's FP8 forms), expand (a garbage block table), the
    # query side, the scorer, the selection and the fused selection
    # (garbage offsets, tables, caches, logits widths and workspaces), each
    # with validate=False over garbage indices and each reaching its kernel
    # (a call that launches nothing proves nothing).
    libasan = sanitized.libasan()
    if libasan is None:
        pytest.skip("the host compiler has no AddressSanitizer runtime")
    done = sanitized.run(_SANITIZED_FAMILIES_RUN.format(tests=str(ROOT / "tests")), libasan)
    assert "AddressSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stderr[-4000:]
    families = "['hadamard_quant_fp8', 'kpool_compress_fp8', 'kpool_expand_topk', 'kpool_index_logits_fp8', "
    families += "'kpool_index_select_fp8', 'kpool_index_topk', 'kpool_ring_close_fp8', 'kpool_tail_update_fp8']"
    assert f"families: {families}" in done.stdout, done.stdout
    sanitized.assert_instrumented(done.stdout)


# The scorer's and the fused select's sm_90a path (KPOOL_CUPY_EMULATE_MMA=wgmma) on inputs that reach the walk,
# the stores to the key tiles and the reloads for another request: near-valid batches with pages missing, past the
# cache and negative, lengths far past the table, tiles across requests, unaligned queries, pages of 8 (a tile
# copied row by row) and of 64 (a tile copied from one page, rows past a request's reach too), and both garbage
# families, and one block a token walking a select's every chunk (on the e4m3 path too). The select's dynamic
# shared memory is exactly the launch's bytes: a tile past it is an overflow.
_SANITIZED_WGMMA_RUN = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    from garbage import index_garbage_cases, select_garbage_cases
    from index_cases import index_case
    from kpool_cupy import emulate
    from kpool_cupy.emulator.launch import recording

    os.environ["KPOOL_CUPY_EMULATE_MMA"] = "wgmma"
    rng = np.random.default_rng(5)
    calls = 0
    for head_dim, heads, block_size in [(d, h, b) for d in (64, 128, 256) for h in (3, 64, 100) for b in (8, 64)]:
        case = index_case(rng, head_dim=head_dim, heads=heads, kpool=2, block_size=block_size, counts=(2, 1, 3),
                          cache_lengths=(300, 7, 150))
        table = case.cache_block_table
        table[0, 1], table[0, 2], table[2, 1] = -1, case.cache.shape[0] + 3, -7
        lengths = case.cache_lengths.copy()
        lengths[1] = 10 ** 6  # far past its table row
        case.cache_lengths = lengths
        raw = np.zeros(case.q.size + 1, np.uint8)
        raw[1:] = case.q.reshape(-1)
        case.q = raw[1:].reshape(case.q.shape)
        with recording() as launches:
            emulate.kpool_index_logits_fp8(*case.args, kpool=case.kpool, max_pools=400, validate=False)
            emulate.kpool_index_select_fp8(*case.args, kpool=case.kpool, pool_topk=40, validate=False)
        calls += len(launches)
    # One block a token walking its every chunk (the select's ring across chunks, after a seed pass over a
    # late chunk, or two at pool_topk 1100), a page missing, one past the cache and a length past the table; on
    # the mma.sync path too.
    from kpool_cupy.ops import index_select_fp8
    index_select_fp8.select_splits = lambda tokens, pool_topk: 1
    for path, block_size, seen, pool_topk in [("wgmma", 8, 3500, 100), ("wgmma", 64, 3500, 100),
                                              ("e4m3", 16, 3500, 100), ("wgmma", 64, 6300, 1100)]:
        os.environ["KPOOL_CUPY_EMULATE_MMA"] = path
        case = index_case(rng, head_dim=128, heads=3, kpool=1, block_size=block_size, counts=(2, 1, 2),
                          cache_lengths=(seen, 5, 3200))
        case.cache_block_table[0, 3], case.cache_block_table[2, 5] = -1, case.cache.shape[0] + 1
        lengths = case.cache_lengths.copy()
        lengths[1] = 10 ** 6
        case.cache_lengths = lengths
        with recording() as launches:
            emulate.kpool_index_select_fp8(*case.args, kpool=1, pool_topk=pool_topk, validate=False)
        calls += len(launches)
    os.environ["KPOOL_CUPY_EMULATE_MMA"] = "wgmma"
    for function, case in [*index_garbage_cases(3, 20), *select_garbage_cases(3, 8)]:
        with recording() as launches:
            getattr(emulate, function)(**case, validate=False)
        calls += len(launches)
    print("wgmma launches:", calls)
    """
)


@pytest.mark.slow
def test_address_sanitizer_sees_the_wgmma_scorer_stay_inside_its_arrays():
    libasan = sanitized.libasan()
    if libasan is None:
        pytest.skip("the host compiler has no AddressSanitizer runtime")
    done = sanitized.run(_SANITIZED_WGMMA_RUN.format(tests=str(ROOT / "tests")), libasan)
    assert "AddressSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stderr[-4000:]
    # 18 near-valid calls of each, 4 walking selects and the garbage calls that reach a kernel (a max_pools of 0
    # or no token launches none).
    launches = re.search(r"^wgmma launches: (\d+)$", done.stdout, re.MULTILINE)
    assert launches and int(launches.group(1)) >= 36 + 4 + 5, done.stdout
    sanitized.assert_instrumented(done.stdout)


_OUT_OF_BOUNDS = textwrap.dedent(
    """
    import numpy as np
    from kpool_cupy import emulate
    from kpool_cupy.kernel.declarations import COMPRESS
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    k = np.zeros((8, 16), bf16)
    out = np.zeros((4, 16), bf16)
    offsets = np.array([0, 16], np.int64)
    cache = np.array([0], np.int64)
    pools = np.array([0, 4], np.int64)
    # A launch that lies about total_tokens (16 rows, k has 8): only the
    # sanitizer stands between this and a silent out-of-bounds read.
    args = COMPRESS.arguments(dict(
        k=k, k_row_stride=16, gate=k, gate_row_stride=16, ape=np.zeros((4, 16), np.float32), ape_row_stride=16,
        input_row_offsets=offsets, cache_lengths=cache, pool_row_offsets=pools, batch=1, total_tokens=16,
        guess_pools=4, pooled=out, pooled_row_stride=16, pooled_rows=4))
    i64 = np.dtype(np.int64)
    name = COMPRESS.instance(KT=bf16, GT=bf16, OT=bf16, HEAD_DIM=16, KPOOL=4, VECTOR=0, IO=i64, IC=i64, IP=i64)
    emulate.launch(COMPRESS.source, name, 1, 8, args)
    """
)


@pytest.mark.slow
def test_address_sanitizer_control_catches_a_planted_overrun():
    # Proves the harness above can fail: a planted overrun is reported.
    libasan = sanitized.libasan()
    if libasan is None:
        pytest.skip("the host compiler has no AddressSanitizer runtime")
    done = sanitized.run(_OUT_OF_BOUNDS, libasan)
    assert done.returncode != 0
    assert "AddressSanitizer" in done.stderr and "heap-buffer-overflow" in done.stderr, done.stderr[-4000:]


def test_an_argument_of_the_wrong_width_is_refused():
    # np.int64 where the kernel takes an int would shift later arguments on a GPU.
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    k = np.zeros((8, 16), bf16)
    index = np.array([0, 8], np.int64)
    from kpool_cupy.kernel.declarations import COMPRESS

    args = list(
        COMPRESS.arguments(
            {
                "k": k,
                "k_row_stride": 16,
                "gate": k,
                "gate_row_stride": 16,
                "ape": np.zeros((4, 16), np.float32),
                "ape_row_stride": 16,
                "input_row_offsets": index,
                "cache_lengths": index[:1],
                "pool_row_offsets": np.array([0, 2], np.int64),
                "batch": 1,
                "total_tokens": 8,
                "guess_pools": 2,
                "pooled": np.zeros((2, 16), bf16),
                "pooled_row_stride": 16,
                "pooled_rows": 2,
            }
        )
    )
    i64 = np.dtype(np.int64)
    name = COMPRESS.instance(KT=bf16, GT=bf16, OT=bf16, HEAD_DIM=16, KPOOL=4, VECTOR=0, IO=i64, IC=i64, IP=i64)
    emulate.launch(COMPRESS.source, name, 1, 4, tuple(args))  # the right widths run
    batch = [p.name for p in COMPRESS.params].index("batch")  # a long long
    args[batch] = np.int32(1)
    with pytest.raises(TypeError, match=f"argument {batch}"):
        emulate.launch(COMPRESS.source, name, 1, 4, tuple(args))
    with pytest.raises(TypeError, match=f"takes {len(COMPRESS.params)} arguments"):
        emulate.launch(COMPRESS.source, name, 1, 4, tuple(args[:-1]))


def test_a_wrong_vector_mask_aborts_the_emulator_like_a_gpu_fault(tmp_path):
    # A 16-byte access at a misaligned address faults on a GPU; the emulator
    # aborts rather than let memcpy hide it.
    script = textwrap.dedent(
        """
        import numpy as np, ml_dtypes
        from kpool_cupy import emulate
        from kpool_cupy.kernel.declarations import COMPRESS
        bf16 = np.dtype(ml_dtypes.bfloat16)
        holder = np.zeros((8, 20), bf16)
        k = holder[:, 4:]  # 8 bytes off alignment
        index = np.array([0, 8], np.int64)
        args = COMPRESS.arguments(dict(
            k=k, k_row_stride=20, gate=k, gate_row_stride=20, ape=np.zeros((4, 16), np.float32), ape_row_stride=16,
            input_row_offsets=index, cache_lengths=index[:1], pool_row_offsets=np.array([0, 2], np.int64),
            batch=1, total_tokens=8, guess_pools=2, pooled=np.zeros((2, 16), bf16), pooled_row_stride=16,
            pooled_rows=2))
        # VECTOR = 1 (k aligned) is a lie: k starts 8 bytes off.
        i64 = np.dtype(np.int64)
        name = COMPRESS.instance(KT=bf16, GT=bf16, OT=bf16, HEAD_DIM=16, KPOOL=4, VECTOR=1, IO=i64, IC=i64, IP=i64)
        emulate.launch(COMPRESS.source, name, 1, 4, args)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "misaligned 16-byte access" in done.stderr
