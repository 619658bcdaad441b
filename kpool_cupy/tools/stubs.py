"""The public modules' type stubs (``.pyi``), written from the modules themselves.

The ops are bound at import from the op list (``ops.binding.bind_into``),
so an editor or a type checker reading the source sees no ``def``; the stub
beside each public module gives them their real signatures. It is written
from what the module exports (``__all__``): an op or another function by
its ``inspect.signature`` (an op whose results depend on how it is called
by an ``@overload`` a form, ``ops.binding.typed_forms``), a submodule as an
import, a class by its base.
``tests/test_type_stubs.py`` compares each stub with this text, so a new op,
keyword or default that is not in the stubs fails there;
``python -m kpool_cupy.tools.stubs`` writes them again.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import types
from pathlib import Path

# The public modules with a stub: kpool_cupy.torch needs torch to import.
MODULES = ("kpool_cupy", "kpool_cupy.emulate", "kpool_cupy.reference", "kpool_cupy.torch")

_HEADER = (
    "# Written by kpool_cupy/tools/stubs.py from the module's exports (python -m kpool_cupy.tools.stubs);\n"
    "# tests/test_type_stubs.py checks it.\n"
)
# What an annotation may name, and the import that brings it.
_IMPORTS = {
    "ctypes.": "import ctypes",
    "Path": "from pathlib import Path",
    "Any": "from typing import Any",
    "Literal[": "from typing import Literal",
    "@overload": "from typing import overload",
    "np.": "import numpy as np",
    "torch.": "import torch",
    "DeviceArray": "from .arrays import CupyArray, DeviceArray",  # the GPU path's arrays (kpool_cupy/__init__.pyi only)
}
_STDLIB = ("import ctypes", "from pathlib import Path")
_TYPING = ("Any", "Literal", "overload")  # one ``from typing import`` line, in isort's order
_OURS = ("from .arrays import CupyArray, DeviceArray",)
WIDTH = 120


def _annotation(value: object) -> str:
    if value is inspect.Parameter.empty:
        return "Any"
    if isinstance(value, str):
        return value
    return inspect.formatannotation(value)


def _parameter(p: inspect.Parameter) -> str:
    text = f"{p.name}: {_annotation(p.annotation)}"
    if p.default is not inspect.Parameter.empty:
        if isinstance(p.default, str):
            text += ' = "' + p.default + '"'
        else:
            text += f" = {p.default!r}" if isinstance(p.default, (bool, int, float, type(None))) else " = ..."
    return text


def _function(name: str, function: object) -> str:
    """The function's stub: its signature, or where what it returns depends on how it is called (``ops.binding.
    typed_forms``), an ``@overload`` a form."""
    forms = getattr(function, "__kpool_forms__", ())
    if forms:
        return "\n".join(f"@overload\n{_def(name, form)}" for form in forms)
    return _def(name, inspect.signature(function))  # type: ignore[arg-type]


def _def(name: str, signature: inspect.Signature) -> str:
    listed, star_done = [], False
    for p in signature.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star_done:
            listed.append("*")
            star_done = True
        listed.append(_parameter(p))
    returns = _annotation(signature.return_annotation)
    line = f"def {name}({', '.join(listed)}) -> {returns}: ..."
    if len(line) <= WIDTH:
        return line
    inner = "".join(f"    {p},\n" for p in listed)
    return f"def {name}(\n{inner}) -> {returns}: ..."


def stub_text(module_name: str) -> str:
    """The stub of a public module, from its ``__all__``."""
    module = importlib.import_module(module_name)
    submodules, lines = [], []
    for name in sorted(module.__all__):
        value = getattr(module, name)
        if isinstance(value, types.ModuleType):
            submodules.append(f"from . import {name} as {name}")
        elif inspect.isclass(value):
            lines.append(f"class {name}({value.__base__.__name__}): ...")
        elif callable(value):
            lines.append(_function(name, value))
        else:
            kind = type(value).__name__
            lines.append(f"{name}: {'tuple[str, ...]' if kind == 'tuple' else kind}")
    # Functions follow each other without a blank line; anything else stands apart (ruff's stub style).
    body = lines[0] if lines else ""
    for previous, line in itertools.pairwise(lines):
        functions = previous.startswith(("def ", "@overload")) and line.startswith(("def ", "@overload"))
        body += ("\n" if functions else "\n\n") + line
    used = [line for needle, line in _IMPORTS.items() if needle in body]
    typing = [name for name in _TYPING if f"from typing import {name}" in used]
    used = [line for line in used if not line.startswith("from typing import")]
    used += [f"from typing import {', '.join(typing)}"] if typing else []
    groups = [
        sorted(
            (i for i in used if i in _STDLIB or i.startswith("from typing")), key=lambda i: (i.startswith("from "), i)
        ),
        [i for i in used if i not in _STDLIB + _OURS and not i.startswith("from typing")],
        [*submodules, *(i for i in used if i in _OURS)],
    ]
    imports = "\n\n".join("\n".join(group) for group in groups if group)
    return _HEADER + imports + "\n\n" + body + "\n"


def stub_path(module_name: str) -> Path:
    """Where a module's stub lives: beside its source file."""
    source = Path(importlib.import_module(module_name).__file__ or "")
    return source.with_suffix(".pyi")


def main() -> None:
    for module_name in MODULES:
        stub_path(module_name).write_text(stub_text(module_name))


if __name__ == "__main__":
    main()
