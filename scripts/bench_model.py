"""Print docs/benchmarks.md's model table: what each benchmark shape should take on an H200, from static counts.

    python scripts/bench_model.py            # the markdown table
    python scripts/bench_model.py --check    # exit 1 if docs/benchmarks.md holds another one

A prediction, not a measurement: the bytes a shape must move at the H200's
specified memory bandwidth, against the warp-instructions its kernel variant
issues (its sm_90 SASS, `kpool-cupy ptx --sass`) at the H200's issue rate.
The predicted fraction of a device copy is the ratio of the two times when
issue is the slower, else 1 (memory-bound: the copy roof itself).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kpool_cupy.bench.shapes import BenchShape, minimum_bytes, sweep  # noqa: E402
from kpool_cupy.dtypes import element_dtype  # noqa: E402
from kpool_cupy.kernel.declarations import COMPRESS  # noqa: E402
from kpool_cupy.kernel.geometry import chunk_members  # noqa: E402
from kpool_cupy.tools.sass import summarize_sass  # noqa: E402

# NVIDIA's H200 SXM figures (public specification): HBM3e bandwidth, SMs,
# boost clock; each SM issues one warp-instruction per clock on each of its
# four schedulers.
BANDWIDTH = 4.8e12  # bytes/s
ISSUE_RATE = 132 * 4 * 1.98e9  # warp-instructions/s
BEGIN, END = "<!-- model table: scripts/bench_model.py -->", "<!-- end of model table -->"


def loop_body(sass: str) -> int:
    """Instructions in the member loop of a streamed pool: from a backward branch's target to the branch."""
    addresses = [int(a, 16) for a in re.findall(r"^\s*/\*([0-9a-f]{4,})\*/", sass, re.MULTILINE)]
    labels = {m.group(1): int(m.group(2), 16) for m in re.finditer(r"^(\.L\w+):\s*\n\s*/\*([0-9a-f]+)\*/", sass, re.M)}
    longest = 0
    for match in re.finditer(r"^\s*/\*([0-9a-f]+)\*/\s+(?:@!?P\d\s+)?BRA\s+`\((\.L\w+)\)", sass, re.MULTILINE):
        at, target = int(match.group(1), 16), labels.get(match.group(2))
        if target is not None and target < at:
            longest = max(longest, sum(target <= a <= at for a in addresses))
    return longest


def row(shape: BenchShape) -> str:
    dtype = element_dtype(shape.dtype)
    name = COMPRESS.instance(KT=dtype, GT=dtype, OT=dtype, HEAD_DIM=shape.head_dim, KPOOL=shape.kpool)
    summary = summarize_sass(COMPRESS.source, name)
    member_bytes = 8 * (2 * dtype.itemsize + 4)
    chunk = chunk_members(shape.kpool, member_bytes)
    whole = chunk == shape.kpool
    # Straight-line code runs once per thread. A streamed pool's loop takes
    # the whole chunks after the first; its body is in the static count once.
    iterations = 0 if whole else max(0, (shape.kpool - chunk) // chunk - 1)
    per_thread = summary.instructions + iterations * loop_body(summary.sass)
    warps = -(-shape.pools * (shape.head_dim // 8) // 32)
    nbytes = minimum_bytes(shape)
    memory_us = nbytes / BANDWIDTH * 1e6
    issue_us = warps * per_thread / ISSUE_RATE * 1e6
    fraction = min(1.0, memory_us / issue_us) if issue_us else 1.0
    # A kernel of a few µs is bound by launch latency, which neither roof models.
    predicted = "not modelled (launch-bound)" if memory_us < 2 else f"{fraction:.0%}"
    return (
        f"| {shape.name} | {shape.pools} | {nbytes / 2**20:.1f} | {memory_us:.2f} | {per_thread} | "
        f"{issue_us:.2f} | {predicted} |"
    )


def table() -> str:
    lines = [
        BEGIN,
        "| shape | pools | MiB moved | µs at 4.8 TB/s | instructions per thread | µs at the issue limit | "
        "predicted fraction of copy |",
        "|---|---|---|---|---|---|---|",
        *(row(shape) for shape in sweep()),
        END,
    ]
    return "\n".join(lines)


def main() -> int:
    text = table()
    if "--check" in sys.argv:
        docs = (ROOT / "docs" / "benchmarks.md").read_text()
        found = docs[docs.find(BEGIN) : docs.find(END) + len(END)] if BEGIN in docs else ""
        if found != text:
            print("docs/benchmarks.md's model table differs from scripts/bench_model.py's:\n" + text)
            return 1
        return 0
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
