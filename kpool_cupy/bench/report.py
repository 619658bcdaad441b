"""The benchmark's table, environment record and plot."""

from __future__ import annotations

import datetime
from typing import Any


def environment() -> dict[str, Any]:
    """Date, GPU, driver, CuPy and CUDA versions: what every recorded number is tied to."""
    import cupy

    device = cupy.cuda.Device()
    properties = cupy.cuda.runtime.getDeviceProperties(device.id)
    name = properties["name"]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": name.decode() if isinstance(name, bytes) else name,
        "compute_capability": f"{properties['major']}.{properties['minor']}",
        "driver": cupy.cuda.runtime.driverGetVersion(),
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "cupy": cupy.__version__,
    }


BASE = "kpool-cupy"
_SHORT = {"graph": "graph", "events-around-python": "events"}
NAME = 36  # the name column: the longest record name ("compress-fp8 prefill-4x16384 slots") and a margin


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"


def _compared_call(
    host: dict[str, Any], key: str, skipped: str, label: str, us_field: str, over_field: str, adds: str
) -> str:
    """One line of a call measured beside the hot call (``host[us_field]``, ``host[key + '_matches']``), or
    why it was not (``host[key]``)."""
    if us_field not in host:
        return f"  {skipped}: {host.get(key, 'not measured')}"
    same = "same bits" if host.get(f"{key}_matches") else "DIFFERENT bits"
    return f"  {label} {host[us_field]:.1f} us ({same}); {adds} {host[over_field]:.1f} us"


def table(results: dict[str, Any]) -> list[str]:
    """Per shape: the rotation, the copy roof, and per implementation its timing method, median time,
    bandwidth, fraction of the copy and time over kpool-cupy's (and, where the record names a fixed roof, the
    fraction of it, for the copy too); then the host cost."""
    lines = [
        f"{'shape':<{NAME}}{'implementation':<20}{'timing':<8}{'median us':>11}{'GB/s':>9}{'of copy':>9}{'x kpool':>9}"
    ]
    mixed = False
    empty = results.get("empty_kernel")
    if empty:
        lines.append(
            f"{'empty-kernel':<{NAME}}{'(launch floor)':<20}{_SHORT.get(empty.get('timing'), '?'):<8}"
            f"{empty['median_ms'] * 1e3:>11.2f}  per call, {empty['calls_per_replay']} calls a round"
        )
    for shape in records(results):
        copy = shape["copy"]
        roof = f" of {shape['fixed_roof_gbps'] / 1000:.1f} TB/s" if "fixed_roof_gbps" in shape else ""
        lines.append(
            f"{shape['name']:<{NAME}}{'(d2d copy)':<20}{_SHORT.get(copy.get('timing'), '?'):<8}"
            f"{copy['median_ms'] * 1e3:>11.2f}{copy['gbps']:>9.0f}"
            + (f"{'':>18}  {copy['fraction_of_fixed_roof']:.2f}{roof}" if "fraction_of_fixed_roof" in copy else "")
        )
        rotated = shape.get("rotation")
        if rotated:
            capped = f", capped by {rotated['capped']}" if rotated.get("capped") else ""
            lines.append(
                f"{'':<{NAME}}rotation: {rotated['sets']} input sets, {_mib(rotated['bytes'])} = "
                f"{rotated['over_l2']:.1f} x L2 ({_mib(rotated['l2_bytes'])}){capped}"
            )
        if "bytes_unfused" in shape:
            lines.append(
                f"{'':<{NAME}}bytes: {shape['bytes']} credited to both (the fused kernel's); the unfused sequence "
                f"moves at least {shape['bytes_unfused'] / shape['bytes']:.2f} x that"
            )
        implementations = shape["implementations"]
        base = implementations.get(BASE, {}).get("timing")
        for name, entry in implementations.items():
            if "skipped" in entry or "failed" in entry:
                why = f"skipped: {entry['skipped']}" if "skipped" in entry else f"FAILED: {entry['failed']}"
                lines.append(f"{'':<{NAME}}{name:<20}  {why}")
                continue
            ratio = entry.get("time_over_kpool_cupy")
            mark = ""
            if base is not None and entry.get("timing") != base:
                mark, mixed = " *", True
            ratio_text = f"{ratio:>9.2f}{mark}" if ratio is not None else ""
            if "time_over_empty_kernel" in entry:
                ratio_text += f"  {entry['time_over_empty_kernel']:.1f} x empty"
            if "tflops" in entry:
                ratio_text += f"  {entry['tflops']:.1f} TFLOP/s"
            if "fraction_of_fixed_roof" in entry:
                ratio_text += f"  {entry['fraction_of_fixed_roof']:.2f}{roof}"
            if "worst_fraction_of_bf16_bound" in entry:
                worst = entry["worst_fraction_of_bf16_bound"]
                ratio_text += "  within bf16 bound" if worst <= 1 else f"  {worst:.2f} x bf16 bound"
            if "same_bytes_as_kpool_cupy" in entry:
                differing = entry.get("differing_bytes_vs_kpool_cupy")
                ratio_text += "  same bytes" if entry["same_bytes_as_kpool_cupy"] else f"  {differing} bytes DIFFER"
            lines.append(
                f"{'':<{NAME}}{name:<20}{_SHORT.get(entry.get('timing'), '?'):<8}{entry['median_ms'] * 1e3:>11.2f}"
                f"{entry['gbps']:>9.0f}{entry['fraction_of_copy']:>9.2f}{ratio_text}"
            )
    lines.append(
        "timing: graph = replay of a CUDA graph of one round of calls; events = CUDA events around the Python loop "
        "(host time shows where it exceeds the device's)."
    )
    lines.append("x kpool: median time over kpool-cupy's in the same shape (above 1: slower).")
    if mixed:
        lines.append("*: timed by another method than kpool-cupy; the ratio compares the two methods too.")
    host = results.get("host")
    if host:
        lines.append(
            f"host per call ({host['shape']}, median of loops of {host.get('calls_per_sample', '?')} calls): "
            f"validate on {host['call_us_validate_on']:.1f} us, off {host['call_us_validate_off']:.1f} us"
        )
        lines.append(
            _compared_call(
                host, "bare_launch", "bare CuPy launch", "bare CuPy launch of the same kernel and arguments",
                "bare_launch_us", "overhead_over_bare_us", "the package adds",
            )
        )  # fmt: skip
        lines.append(
            _compared_call(
                host, "torch_op", "through torch.ops.kpool.compress.out",
                "the same hot call through torch.ops.kpool.compress.out", "call_us_torch_op",
                "torch_op_over_cupy_us", "torch adds",
            )
        )  # fmt: skip
        lines.append(f"  device time of one CUDA-graph replay of the call: {host['graph_replay_us']:.2f} us")
        lines.extend(_decode_step_host_lines(host.get("decode_step", [])))
    fp8_host = results.get("host_fp8_decode")
    if fp8_host:
        lines.append(
            f"host per hot call of kpool_tail_update_fp8 ({fp8_host['shape']}, validate off, outputs given): "
            f"{fp8_host['call_us']:.1f} us"
        )
        lines.append(
            _compared_call(
                fp8_host, "bare_launch", "bare CuPy launch", "bare CuPy launch of the same kernel and arguments",
                "bare_launch_us", "overhead_over_bare_us", "the package adds",
            )
        )  # fmt: skip
    if empty:
        lines.append("x empty: kpool-cupy's median time over the empty kernel's, both by graph replay.")
    return lines


def _decode_step_host_lines(step: list[dict[str, Any]]) -> list[str]:
    """The decode step's ops' host costs (bench.host_step), a line each: us a call validated and not, over the
    bare launch, and torch's op over the CuPy call beside an empty torch op's cost."""
    lines = [f"host per op of a decode step ({step[0]['shape']}, outputs and workspaces given):"] if step else []
    for r in step:
        bare = f"{r['overhead_over_bare_us']:+.1f} over bare" if "overhead_over_bare_us" in r else r["bare_launch"]
        torch_op = (
            f"torch op {r['torch_op_over_cupy_us']:+.1f} (an empty op {r['empty_torch_op_us']:.1f})"
            if "torch_op_over_cupy_us" in r
            else f"torch op: {r['torch_op']}"
        )
        lines.append(
            f"  {r['op']:<30} off {r['call_us_validate_off']:.1f} us ({bare}), on {r['call_us_validate_on']:.1f} us;"
            f" {torch_op}"
        )
    return lines


def records(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every timed record so far, in the order the run makes them: the decode side, the FP8 records, the sweep."""
    return [
        *results.get("lifecycle", []),
        *results.get("fp8", []),
        *results.get("index", []),
        *results.get("select", []),
        *results.get("backward", []),
        *results.get("shapes", []),
    ]


def plot(results: dict[str, Any], path: str) -> None:
    """Per shape: every implementation's fraction of the copy roof, and its time over kpool-cupy's.

    Every record so far (``records``: the decode side, the FP8 records and
    the sweep's shapes) runs along the x axis in order of bytes moved;
    hatched bars were timed with events around Python, plain ones by graph
    replay.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise RuntimeError("--plot needs matplotlib: pip install 'kpool-cupy[plot]'") from error
    shapes = sorted(records(results), key=lambda s: s["bytes"])
    names = list(dict.fromkeys(n for s in shapes for n, e in s["implementations"].items() if "median_ms" in e))
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 0.5 * len(shapes) + 3), 8), sharex=True)
    width = 0.8 / max(len(names), 1)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, name in enumerate(names):
        labelled = False  # an implementation's first bar, in whichever shape it first appears, names it
        for s_index, shape in enumerate(shapes):
            entry = shape["implementations"].get(name, {})
            if "median_ms" not in entry:
                continue
            x = s_index - 0.4 + width * (n + 0.5)
            hatch = "//" if entry.get("timing") == "events-around-python" else None
            style = {"color": colors[n % len(colors)], "hatch": hatch, "label": None if labelled else name}
            labelled = True
            top.bar(x, entry["fraction_of_copy"], width, **style)
            if "time_over_kpool_cupy" in entry:
                bottom.bar(x, entry["time_over_kpool_cupy"], width, **{**style, "label": None})
    top.axhline(1.0, color="k", linestyle="--", linewidth=1)
    top.set_ylabel("fraction of d2d copy bandwidth")
    env = results.get("environment", {})
    top.set_title(f"kpool-cupy, {env.get('gpu', '?')}, {env.get('date', '')[:10]} (hatched: events around Python)")
    if names:
        top.legend(fontsize="small", ncol=2)
    bottom.axhline(1.0, color="k", linewidth=1)
    bottom.set_yscale("log")
    bottom.set_ylabel("median time / kpool-cupy's")
    bottom.set_xticks(range(len(shapes)))
    bottom.set_xticklabels([s["name"] for s in shapes], rotation=30, ha="right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
