"""The README's worked example runs on both CPU backends and asserts what it claims."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def example() -> str:
    text = README.read_text().split("## A whole request: chunked prefill, then decode", 1)[1]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


@pytest.mark.parametrize("backend", ["emulate", "reference"])
def test_worked_example(backend):
    code = example().replace("kp = kpool_cupy.emulate", f"kp = kpool_cupy.{backend}")
    assert f"kpool_cupy.{backend}" in code
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)  # the example's own asserts check the pools
    assert len(namespace["pools"]) == 23 // 4
