"""The ``kpool-cupy`` command line."""

from __future__ import annotations

import json
import sys

import click

from ._check import BACKENDS, pick_backend, run_check
from ._dtypes import element_dtype


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
@click.option("--head-dim", type=int, default=128, show_default=True)
@click.option("--kpool", type=int, default=4, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object and nothing else.")
def check(backend: str, dtype: str, head_dim: int, kpool: int, seed: int, as_json: bool) -> None:
    """Run a backend over random ragged batches against the float64 reference."""
    chosen = pick_backend(backend)
    try:
        results = run_check(chosen, element_dtype(dtype), head_dim, kpool, seed)
    except (ValueError, TypeError, RuntimeError) as error:
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
