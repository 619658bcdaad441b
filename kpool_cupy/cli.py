"""The ``kpool-cupy`` command line."""

from __future__ import annotations

import json
import sys

import click

from .dtypes import MAX_KPOOL, element_dtype
from .tools.self_check import BACKENDS, pick_backend, run_check


@click.group()
@click.version_option(package_name="kpool-cupy")
def main() -> None:
    """k-pool compression kernels for CuPy: correctness checks and tools."""


@main.command()
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default="auto",
    show_default=True,
    help="auto: cupy with a usable GPU, else emulate with a C++ compiler, else reference.",
)
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16", show_default=True)
@click.option("--head-dim", type=click.IntRange(min=8), default=128, show_default=True)
@click.option("--kpool", type=click.IntRange(min=1, max=MAX_KPOOL), default=4, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object and nothing else.")
def check(backend: str, dtype: str, head_dim: int, kpool: int, seed: int, as_json: bool) -> None:
    """Run a backend over random ragged batches against the float64 reference."""
    chosen = pick_backend(backend)
    try:
        results = run_check(chosen, element_dtype(dtype), head_dim, kpool, seed)
    except (ValueError, TypeError, RuntimeError, ImportError) as error:
        raise click.ClickException(str(error)) from error
    ok = all(r.ok for r in results)
    if as_json:
        cases = [
            {"name": r.name, "pools": r.pools, "max_abs_err": r.max_abs_err, "max_ulp_err": r.max_ulp_err, "ok": r.ok}
            for r in results
        ]
        click.echo(json.dumps({"backend": chosen, "ok": ok, "cases": cases}))
    else:
        click.echo(f"backend {chosen}, {dtype}, head_dim {head_dim}, kpool {kpool}, seed {seed}")
        header = f"{'case':<24}{'requests':>9}{'tokens':>8}{'pools':>7}{'max abs err':>13}{'max ulp':>9}  result"
        click.echo(header)
        for r in results:
            verdict = "pass" if r.ok else "FAIL"
            click.echo(
                f"{r.name:<24}{r.requests:>9}{r.tokens:>8}{r.pools:>7}{r.max_abs_err:>13.3g}{r.max_ulp_err:>9.2f}  "
                f"{verdict}"
            )
        click.echo("all cases pass" if ok else "some cases FAILED")
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


@main.command()
@click.option("--head-dim", type=click.IntRange(min=8), default=128, show_default=True)
@click.option("--kpool", type=click.IntRange(min=1, max=MAX_KPOOL), default=4, show_default=True)
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16", show_default=True)
@click.option("--arch", default="sm_90", show_default=True, help="sm_NN: ptxas reports registers for this GPU.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, writable=True), help="Save the PTX here.")
def ptx(head_dim: int, kpool: int, dtype: str, arch: str, out_file: str | None) -> None:
    """Compile one variant through NVRTC (no GPU needed) and report its memory path."""
    from .tools.ptx_report import summarize

    try:
        summary = summarize(head_dim, kpool, dtype, arch)
    except (ValueError, TypeError, RuntimeError) as error:
        raise click.ClickException(str(error)) from error
    click.echo(f"kpool_compress {dtype}, head_dim {head_dim}, kpool {kpool}, {arch}")
    click.echo(f"registers           {summary.registers}")
    click.echo(f"spill stores/loads  {summary.spill_stores} / {summary.spill_loads} bytes")
    click.echo(f"128-bit loads       {summary.vector_loads}")
    click.echo(f"128-bit stores      {summary.vector_stores}")
    click.echo(f"scalar loads        {summary.scalar_loads} (index reads and the unaligned fallback)")
    click.echo(f"local memory        {'yes' if summary.local_memory else 'none'}")
    if out_file:
        with open(out_file, "w") as handle:
            handle.write(summary.ptx)
        click.echo(f"PTX written to {out_file}")


@main.command()
@click.option("--json", "json_file", type=click.Path(dir_okay=False, writable=True), help="Write all numbers here.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False, writable=True), help="Draw bandwidth here (PNG).")
@click.option("--quick", is_flag=True, help="Three head_dim-128 shapes instead of the whole sweep.")
@click.option(
    "--samples", type=click.IntRange(min=1), default=30, show_default=True, help="Timed samples per implementation."
)
@click.option("--skip", multiple=True, help="Implementation to leave out (repeatable), e.g. torch-compile.")
def bench(json_file: str | None, plot_file: str | None, quick: bool, samples: int, skip: tuple[str, ...]) -> None:
    """Device time against a d2d copy and the alternatives, on the GPU (exits 2 without one)."""
    from .backends.cupy import gpu_status

    usable, why = gpu_status()
    if not usable:
        click.echo(f"kpool-cupy bench needs a CUDA GPU: {why}", err=True)
        sys.exit(2)
    from .bench.impls import IMPLEMENTATIONS
    from .bench.report import environment, plot, table
    from .bench.run import run_sweep
    from .bench.shapes import sweep

    unknown = set(skip) - set(IMPLEMENTATIONS)
    if unknown:
        raise click.ClickException(f"Invalid --skip: expected some of {sorted(IMPLEMENTATIONS)}, got {sorted(unknown)}")
    chosen = [name for name in IMPLEMENTATIONS if name not in skip]

    def progress(shapes):
        return click.progressbar(shapes, label="benchmark", file=sys.stderr, item_show_func=lambda s: s and s.name)

    results = {"environment": environment(), **run_sweep(sweep(quick), chosen, samples, progress, quick)}
    for line in table(results):
        click.echo(line)
    if json_file:
        with open(json_file, "w") as handle:
            json.dump(results, handle, indent=1)
    if plot_file:
        plot(results, plot_file)
