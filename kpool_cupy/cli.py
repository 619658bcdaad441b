"""The ``kpool-cupy`` command line."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .dtypes import MAX_KPOOL, dtype_name, element_dtype
from .kernel.geometry import HEAD_DIM_RULE, takes_head_dim
from .kernel.nvrtc import ARCH_FORMS
from .tools.op_checks import OP_CHECKS
from .tools.self_check import BACKENDS, check_settings, pick_backend, run_check
from .tools.variants import ELEMENTS, SELECT_POOL_TOPK
from .tools.variants import OP_KERNELS as OP_NAMES

# Every spelling kpool_cupy's Python functions accept, so the CLI and the API agree.
DTYPES = ("bfloat16", "bf16", "float16", "fp16", "float32")


def _head_dim(ctx: click.Context, param: click.Parameter, value: int) -> int:
    if not takes_head_dim(value):
        raise click.BadParameter(f"expected {HEAD_DIM_RULE}, got {value}")
    return value


def _output_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An output path whose folder exists and is writable: checked before any work, not after it."""
    if value is None:
        return None
    if not value:
        raise click.BadParameter("expected a file name, got an empty one")
    folder = Path(value).expanduser().resolve().parent
    if not folder.is_dir():
        raise click.BadParameter(f"folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise click.BadParameter(f"folder {folder} is not writable")
    return value


def _write(path: str, text: str) -> None:
    """``text`` into ``path``; a failure (a full disk, a file that refuses writing) is a click error naming it."""
    try:
        Path(path).write_text(text)
    except OSError as error:
        raise click.ClickException(f"cannot write {path}: {error.strerror or error}") from error


def _plot_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError as error:
            raise click.BadParameter("drawing needs matplotlib: pip install 'kpool-cupy[plot]'") from error
    return _output_file(ctx, param, value)


def _file_option(flag: str, callback: Callable[..., str | None], help: str) -> Callable[..., Any]:
    """A file to write, ``--json`` into ``json_file``, its path checked by ``callback`` before any work."""
    return click.option(flag, f"{flag[2:]}_file", type=click.Path(dir_okay=False), callback=callback, help=help)


def _op_option(help: str) -> Callable[..., Any]:
    """``--op``: one op by its name without ``kpool_`` (as under torch.ops.kpool), compress by default."""
    return click.option("--op", type=click.Choice(list(OP_NAMES)), default="compress", show_default=True, help=help)


# The bench's switches, each a set of records on by default (``--fp8/--no-fp8``), in the order of ``--help``.
_RECORD_SWITCHES = (
    (
        "host",
        "Time the host's cost per call first: kpool_compress, and each op of the indexer's decode step, validated "
        "and not, beside a bare launch and through torch.ops.kpool.",
    ),
    ("decode-side", "Also time the tail update and expand top-k against their composites."),
    (
        "fp8",
        "Also time kpool_compress_fp8 into a paged cache against the unfused sequence, the FP8 tail update (and "
        "its host cost) and ring close, and hadamard_quant_fp8.",
    ),
    ("sweep", "Time kpool_compress over the sweep's shapes (the records above run first either way)."),
    ("index", "Also time kpool_index_logits_fp8 at the engines' decode and prefill shapes against a CuPy composite."),
    (
        "select",
        "Also time kpool_index_select_fp8 against the scorer then kpool_index_topk, and a torch composite; "
        "and kpool_index_topk alone against torch.topk.",
    ),
    ("backward", "Also time kpool_compress_backward against torch autograd through an eager implementation."),
)


def _record_switches(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--NAME/--no-NAME`` for every switch of ``_RECORD_SWITCHES`` (default on), onto ``command``."""
    for name, help in reversed(_RECORD_SWITCHES):
        command = click.option(f"--{name}/--no-{name}", default=True, show_default=True, help=help)(command)
    return command


def _skip(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    from .bench.impls import IMPLEMENTATIONS

    unknown = sorted(set(value) - set(IMPLEMENTATIONS))
    if unknown:
        raise click.BadParameter(f"expected some of {sorted(IMPLEMENTATIONS)}, got {unknown}")
    return value


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kpool-cupy")
def main() -> None:
    """k-pool compression kernels for CuPy: correctness checks and tools."""


class _UsageRules(click.Command):
    """A command with usage rules between options (``check_together``), checked after each option's own."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        self.check_together(ctx)
        return rest

    def check_together(self, ctx: click.Context) -> None:
        """Usage rules between options, after each option's own: a ``click.UsageError``."""


def _json_error(backend: str | None, op: str | None, said: str) -> dict[str, Any]:
    """``check --json``'s object for a run that checked nothing: the backend and op asked for (None where the
    usage error came before they were read), the error, no cases; the same keys whatever went wrong."""
    return {"backend": backend, "op": op, "ok": False, "error": said, "cases": []}


class _JsonUsageErrors(_UsageRules):
    """A command whose ``--json`` holds for a usage error too: one JSON object on stdout, exit status 2."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        wants_json = "--json" in args
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as error:
            if not wants_json:
                raise
            click.echo(json.dumps(_json_error(ctx.params.get("backend"), ctx.params.get("op"), error.format_message())))
            ctx.exit(2)


class _BenchUsage(_UsageRules):
    """``bench``'s files: one each (--json and --table naming one file left the table where the JSON was)."""

    def check_together(self, ctx: click.Context) -> None:
        named: dict[Path, str] = {}
        for option, name in (("--json", "json_file"), ("--table", "table_file"), ("--plot", "plot_file")):
            if ctx.params.get(name) is None:
                continue
            path = Path(ctx.params[name]).expanduser().resolve()
            if path in named:
                raise click.UsageError(f"{named[path]} and {option} name one file, {path}: each needs its own", ctx=ctx)
            named[path] = option


class _OpSettingsUsage(_UsageRules):
    """``ptx``'s usage, and ``check``'s: the op's own rules for --head-dim and --kpool, exit 2 before any work."""

    def check_together(self, ctx: click.Context) -> None:
        # The op's own head_dim and kpool rules (the scorer's head_dims, ring close's kpool 2 or more).
        op, head_dim, kpool = (ctx.params[name] for name in ("op", "head_dim", "kpool"))
        try:
            check_settings(op, head_dim, kpool, names=("--head-dim", "--kpool"))
        except ValueError as error:
            raise click.UsageError(str(error), ctx=ctx) from error


class _CheckUsage(_JsonUsageErrors, _OpSettingsUsage):
    """``check``'s usage: the op's rules, and with ``--json`` a usage error as one JSON object."""


@main.command(cls=_CheckUsage)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default="auto",
    show_default=True,
    help="auto: cupy with a usable GPU, else emulate with a C++ compiler, else an error (reference only if asked).",
)
@click.option("--dtype", type=click.Choice(DTYPES), default="bfloat16", show_default=True)
@click.option("--head-dim", type=int, callback=_head_dim, default=128, show_default=True)
@click.option("--kpool", type=click.IntRange(min=1, max=MAX_KPOOL), default=4, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@_op_option("The op to check: pooled values against float64, ids, rings, positions and FP8 bytes bit for bit.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object and nothing else.")
def check(backend: str, dtype: str, head_dim: int, kpool: int, seed: int, op: str, as_json: bool) -> None:
    """Run a backend's op over random ragged batches against the float64 reference."""
    try:
        chosen, reason = pick_backend(backend)
        if sys.stderr.isatty():  # a bar for a person watching; nothing in captured output

            def progress(cases):
                return click.progressbar(cases, label="check", file=sys.stderr, item_show_func=lambda c: c and c.name)

            results = run_check(chosen, element_dtype(dtype), head_dim, kpool, seed, progress, op)
        else:
            results = run_check(chosen, element_dtype(dtype), head_dim, kpool, seed, op=op)
    except (ValueError, TypeError, RuntimeError, ImportError, OSError, MemoryError) as error:  # OSError: the cache
        said = f"out of memory: {error}" if isinstance(error, MemoryError) else str(error)
        if as_json:  # a script reading stdout gets one JSON object whatever happened
            click.echo(json.dumps(_json_error(backend, op, said)))
            sys.exit(1)
        raise click.ClickException(said) from error
    except KeyboardInterrupt:
        if not as_json:
            raise
        click.echo(json.dumps(_json_error(backend, op, "interrupted (Ctrl-C) before every case ran")))
        sys.exit(130)  # the shell's status for SIGINT
    unit = OP_CHECKS[op].unit
    # The settings the op takes; the others changed only the random batches.
    settings = {"dtype": dtype_name(element_dtype(dtype)), "head_dim": head_dim, "kpool": kpool}
    taken = {name: value if name in OP_CHECKS[op].takes else None for name, value in settings.items()}
    checked = [r for r in results if r.status != "skipped"]
    ok = bool(checked) and all(r.ok for r in results)
    if as_json:
        cases = [
            {
                "name": r.name,
                "requests": r.requests,
                "tokens": r.tokens,
                "pools": r.pools,
                "mismatches": r.mismatches,
                "status": r.status,
                "max_abs_err": r.max_abs_err,
                "max_ulp_err": r.max_ulp_err,
                "max_allowed_abs": r.max_allowed_abs,
                "worst_error_over_bound": r.worst_error_over_bound,
                "special_mismatches": r.special_mismatches,
                "ok": r.ok,
            }
            for r in results
        ]
        configuration = {**taken, "seed": seed}
        described = {"op": op, "unit": unit}
        click.echo(
            json.dumps({"backend": chosen, "reason": reason, **described, **configuration, "ok": ok, "cases": cases})
        )
    else:
        click.echo(f"backend {chosen}: {reason}")
        shown = [dtype if taken["dtype"] else None, *(f"{n} {v}" for n, v in taken.items() if n != "dtype" and v)]
        click.echo(", ".join([f"kpool_{op}", *filter(None, shown), f"seed {seed}"]))
        columns = (
            f"{'requests':>9}{'tokens':>8}{unit:>10}{'max abs err':>13}{'max ulp':>9}{'err/bound':>11}{'unequal':>9}"
        )
        click.echo(f"{'case':<24}{columns}  result")
        for r in results:
            pooled = (
                f"{r.max_abs_err:>13.3g}{r.max_ulp_err:>9.2f}{r.worst_error_over_bound:>11.3f}"
                if r.max_abs_err is not None and r.max_ulp_err is not None and r.worst_error_over_bound is not None
                else f"{'-':>13}{'-':>9}{'-':>11}"  # nothing pooled: every output compared bit for bit
            )
            status = r.status if r.status != "skipped" else f"skipped (no {unit})"
            if r.special_mismatches:  # the error columns measure finite values only
                status += f" ({r.special_mismatches} NaN/inf differ)"
            click.echo(f"{r.name:<24}{r.requests:>9}{r.tokens:>8}{r.pools:>10}{pooled}{r.mismatches:>9}  {status}")
        skipped = len(results) - len(checked)
        if ok:
            click.echo(
                f"all {len(checked)} checked cases pass" + (f" ({skipped} skipped: no {unit})" if skipped else "")
            )
        elif not checked:
            click.echo(f"no case had {unit} to compare: nothing was checked")
        else:
            click.echo("some cases FAILED")
    if not ok:
        sys.exit(1)


@main.command()
def info() -> None:
    """Versions, the GPU (or why none is usable), NVRTC, the emulator's compiler and the caches."""
    from .tools.info import machine_facts

    facts = machine_facts()
    width = max(len(name) for name, _ in facts)
    for name, value in facts:
        click.echo(f"{name:<{width}}  {value}")


def _arch(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from .kernel.nvrtc import unknown_arch
    from .tools.sass import sm_arch

    try:
        sm_arch(value)
    except ValueError as error:
        raise click.BadParameter(f"expected {ARCH_FORMS}, got {value!r}") from error
    why = unknown_arch(value)
    if why is not None:  # before any work, as a usage error: NVRTC's own message names no option
        raise click.BadParameter(why)
    return value


@main.command(cls=_OpSettingsUsage)
@click.option("--head-dim", type=int, callback=_head_dim, default=128, show_default=True)
@click.option("--kpool", type=click.IntRange(min=1, max=MAX_KPOOL), default=4, show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="bfloat16", show_default=True)
@click.option(
    "--arch",
    default="sm_90",
    show_default=True,
    callback=_arch,
    help="sm_NN: ptxas reports registers for this GPU; sm_90a: Hopper's arch-specific build, where the scorer "
    "takes wgmma.",
)
@click.option(
    "--sass",
    is_flag=True,
    help="Report the machine code instead: CUDA 13's ptxas (on PATH) and nvdisasm (pip install 'kpool-cupy[sass]').",
)
@_op_option("The op whose kernel to compile (its every-operand-aligned variant; FP8 ops write rows).")
@_file_option("--out", _output_file, "Save the PTX here (the SASS with --sass).")
def ptx(head_dim: int, kpool: int, dtype: str, arch: str, sass: bool, op: str, out_file: str | None) -> None:
    """Compile one op's variant through NVRTC (no GPU needed) and report its memory path."""
    # What the op's kernel is built for, from its template: seed tail and the query side take no kpool,
    # expand no head_dim, the indexer's ops and expand no element type.
    template = {t.name for t in OP_NAMES[op].template}
    built_for = "".join(
        [
            *([f" {dtype}"] if template & set(ELEMENTS) else []),
            *([f", head_dim {head_dim}"] if "HEAD_DIM" in template else []),
            *([f", kpool {kpool}"] if "KPOOL" in template else []),
            *([f", pool_topk up to {SELECT_POOL_TOPK}"] if "CAP" in template else []),
        ]
    )
    if sass:
        from .tools.sass import sm_arch
        from .tools.sass_report import op_sass

        try:
            report = op_sass(op, head_dim, kpool, dtype, arch)
        except (ValueError, TypeError, RuntimeError) as error:
            raise click.ClickException(str(error)) from error
        machine = report.machine
        # Static counts: a loop's body counts once, NOP padding and the end-of-kernel self-branch not at all.
        click.echo(f"kpool_{op}{built_for}, {sm_arch(arch)} SASS")
        softmax = machine.exps > 0  # the ops that pool; seed tail, expand and the query side have no softmax
        rows = [
            ("registers", machine.registers),
            ("spill stores/loads", f"{machine.spill_stores} / {machine.spill_loads} bytes"),
            ("16-byte loads", machine.vector_loads),
            ("16-byte stores", machine.vector_stores),
            ("16-byte loads before the first exp", machine.vector_loads_before_first_exp if softmax else "no softmax"),
            ("branches, first 16-byte load to last exp", machine.branches_in_softmax if softmax else "no softmax"),
            ("static instructions", machine.instructions),
            ("exps (MUFU.EX2)", machine.exps),
            (f"blocks per SM ({report.block_threads}-thread blocks)", report.blocks_per_sm or "unknown arch"),
            ("load round trips (in order, longest path)", report.load_depth),
        ]
        if report.shared_bytes:
            rows.append(("static shared memory a block", f"{report.shared_bytes} bytes"))
        if report.dynamic_bytes:
            rows.append(("dynamic shared memory a block (h64)", f"{report.dynamic_bytes} bytes"))
        if report.tensor_core:
            counts = ", ".join(f"{count} {opcode}" for opcode, count in sorted(report.tensor_core.items()))
            rows.append(("tensor-core instructions", counts))
        if report.copy_stages is not None:
            rows.append(("cp.async pipeline stages", report.copy_stages))
        for label, value in rows:
            click.echo(f"{label:<42}{value}")
        if out_file:
            _write(out_file, machine.sass)
            click.echo(f"SASS written to {out_file}")
        return
    from .tools.ptx_report import summarize

    try:
        summary = summarize(head_dim, kpool, dtype, arch, op=op)
    except (ValueError, TypeError, RuntimeError) as error:
        raise click.ClickException(str(error)) from error
    click.echo(f"kpool_{op}{built_for}, {arch}")
    click.echo(f"registers           {summary.registers}")
    click.echo(f"spill stores/loads  {summary.spill_stores} / {summary.spill_loads} bytes")
    click.echo(f"128-bit loads       {summary.vector_loads}")
    click.echo(f"128-bit stores      {summary.vector_stores}")
    click.echo(f"64-bit stores       {summary.eight_byte_stores} (FP8 value rows, 8 bytes a thread)")
    click.echo(f"byte stores         {summary.byte_stores} (FP8 values where rows are not 8-byte aligned)")
    click.echo(f"scalar loads        {summary.scalar_loads} (index reads and the unaligned fallback)")
    click.echo(f"shuffles (bfly)     {summary.butterfly_shuffles} (FP8 rotation and row maximum; split selection)")
    click.echo(f"local memory        {'yes' if summary.local_memory else 'none'}")
    if out_file:
        _write(out_file, summary.ptx)
        click.echo(f"PTX written to {out_file}")


@main.command(cls=_BenchUsage)
@_file_option("--json", _output_file, "Write all numbers here.")
@_file_option("--plot", _plot_file, "Draw each shape's fractions of the copy and ratios to kpool-cupy here (PNG).")
@_file_option("--table", _output_file, "Write the table here too, rewritten after every record.")
@click.option(
    "--quick",
    is_flag=True,
    help="Three head_dim-128 shapes instead of the whole sweep, and fewer, smaller records of every other kind "
    "(the scorer's, the selections' and the backward's at toy sizes).",
)
@click.option(
    "--samples", type=click.IntRange(min=1), default=30, show_default=True, help="Timed samples per implementation."
)
@click.option(
    "--min-calls",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Calls per captured round at least (rounds with fewer input sets go round them again).",
)
@click.option(
    "--skip",
    multiple=True,
    callback=_skip,
    help="An implementation of the sweep's shapes to leave out (repeatable), e.g. torch-compile. The records "
    "before the sweep time kpool-cupy's own calls; the --no-* switches leave those out.",
)
@_record_switches
def bench(
    json_file: str | None,
    plot_file: str | None,
    table_file: str | None,
    quick: bool,
    samples: int,
    min_calls: int,
    skip: tuple[str, ...],
    decode_side: bool,
    fp8: bool,
    index: bool,
    select: bool,
    backward: bool,
    sweep: bool,
    host: bool,
) -> None:
    """Device time against a d2d copy and the alternatives, on the GPU (exits 2 without one).

    Device times come from replaying a CUDA graph of one round of calls where
    the calls can be captured, else from events around the Python loop; the
    JSON says which for every implementation. Host time per call is reported
    next to a bare CuPy launch of the same kernel. The short records (decode
    side, FP8, the scorer) run before the sweep; the JSON and the table are rewritten
    after every record and the plot after every shape of the sweep, so a run
    cut short keeps what it measured.
    """
    from .backends.cupy import gpu_status

    usable, why = gpu_status()
    if not usable:
        click.echo(f"kpool-cupy bench needs a CUDA GPU: {why}", err=True)
        sys.exit(2)
    from .bench import timing
    from .bench.impls import IMPLEMENTATIONS
    from .bench.report import environment, plot, table
    from .bench.run import run_sweep
    from .bench.shapes import sweep as sweep_shapes

    chosen = [name for name in IMPLEMENTATIONS if name not in skip]
    timing.MIN_GRAPH_CALLS = min_calls  # read by every capture of this run

    def progress(shapes):
        return click.progressbar(shapes, label="benchmark", file=sys.stderr, item_show_func=lambda s: s and s.name)

    env = environment()

    drawn = [-1]  # the sweep's shapes in the plot last drawn

    def write(partial: dict) -> None:  # after every record, so a run cut short keeps what it measured
        done = {"environment": env, **partial}
        if json_file:
            _write(json_file, json.dumps(done, indent=1))
        if table_file:
            _write(table_file, "\n".join(table(done)) + "\n")
        # The plot once the short records are done and after every shape of the sweep (drawing takes a second).
        if plot_file and "shapes" in partial and len(partial["shapes"]) != drawn[0]:
            plot(done, plot_file)
            drawn[0] = len(partial["shapes"])

    shapes = sweep_shapes(quick) if sweep else []
    swept = run_sweep(
        shapes, chosen, samples, progress, quick, write, decode_side, fp8, index, select, backward, host=host
    )
    results = {"environment": env, **swept}
    results["complete"] = True
    for line in table(results):
        click.echo(line)
    drawn[0] = -1  # the last plot says complete too
    write(results)
