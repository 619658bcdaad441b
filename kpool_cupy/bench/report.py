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


def table(results: dict[str, Any]) -> list[str]:
    """One line per shape and implementation: median time, bandwidth, fraction of the copy roof."""
    lines = [f"{'shape':<28}{'implementation':<20}{'median us':>11}{'GB/s':>9}{'of copy':>9}"]
    for shape in [*results["shapes"], *results.get("lifecycle", [])]:
        copy = shape["copy"]
        lines.append(f"{shape['name']:<28}{'(d2d copy)':<20}{copy['median_ms'] * 1e3:>11.2f}{copy['gbps']:>9.0f}")
        for name, entry in shape["implementations"].items():
            if "skipped" in entry or "failed" in entry:
                why = f"skipped: {entry['skipped']}" if "skipped" in entry else f"FAILED: {entry['failed']}"
                lines.append(f"{'':<28}{name:<20}  {why}")
            else:
                lines.append(
                    f"{'':<28}{name:<20}{entry['median_ms'] * 1e3:>11.2f}{entry['gbps']:>9.0f}"
                    f"{entry['fraction_of_copy']:>9.2f}"
                )
    host = results.get("host")
    if host:
        lines.append(
            f"host cost per call ({host['shape']}): validate on {host['call_us_validate_on']:.1f} us, "
            f"off {host['call_us_validate_off']:.1f} us; CUDA-graph replay {host['graph_replay_us']:.2f} us"
        )
    return lines


def plot(results: dict[str, Any], path: str) -> None:
    """Bandwidth against bytes moved, one line per implementation, the copy as the roof."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise RuntimeError("--plot needs matplotlib: pip install 'kpool-cupy[plot]'") from error
    shapes = sorted(results["shapes"], key=lambda s: s["bytes"])
    figure, axes = plt.subplots(figsize=(8, 5))
    axes.plot([s["bytes"] for s in shapes], [s["copy"]["gbps"] for s in shapes], "k--", label="d2d copy (roof)")
    names = dict.fromkeys(n for s in shapes for n in s["implementations"])
    for name in names:
        points = [
            (s["bytes"], s["implementations"][name]["gbps"])
            for s in shapes
            if "gbps" in s["implementations"].get(name, {})
        ]
        if points:
            axes.plot(*zip(*points, strict=True), marker="o", label=name)
    axes.set_xscale("log")
    axes.set_xlabel("minimum bytes moved per call")
    axes.set_ylabel("achieved bandwidth (GB/s)")
    env = results.get("environment", {})
    axes.set_title(f"kpool_compress, {env.get('gpu', '?')}, {env.get('date', '')[:10]}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
