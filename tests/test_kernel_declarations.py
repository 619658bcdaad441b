"""Each ``__global__`` of kernels/ against its one Python declaration (kpool_cupy/kernel/declarations.py).

The declaration builds every launch's instance name and argument tuple, so
a parameter renamed, retyped, added or moved in a ``.cu`` file without its
declaration (two ``long long`` swapped, say) fails here, not on a GPU.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from kpool_cupy.kernel.declarations import COMPRESS, KERNELS, Kernel
from kpool_cupy.kernel.sources import kernels_dir

_GLOBAL = re.compile(r"\btemplate\s*<(?P<template>[^>]*)>\s*__global__\s+void\s+")


def _balanced(text: str, start: int) -> tuple[str, int]:
    """The text inside the parentheses opening at ``start``, and the index after the closing one."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i], i + 1
    raise AssertionError(f"unbalanced parentheses from offset {start}")


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


_DEFINE = re.compile(r"^[ \t]*#define[ \t]+(?P<name>KP_\w+_PARAMS)(?:\((?P<param>\w*)\))?(?P<body>.*)$", re.M)


def _parameter_macros(text: str) -> dict[str, tuple[str | None, str]]:
    """The ``KP_..._PARAMS`` macros a source defines (parameter lists the kernels of a family share)."""
    joined = _strip_comments(text).replace("\\\n", " ")
    return {m["name"]: (m["param"], m["body"]) for m in _DEFINE.finditer(joined)}


def _expand(text: str, macros: dict[str, tuple[str | None, str]]) -> str:
    """``text`` with every use of ``macros`` replaced by its body (an argument in place of the parameter)."""
    for name, (param, body) in macros.items():
        if param is None:
            text = re.sub(rf"\b{name}\b", lambda _, body=body: body, text)
        else:
            use = re.compile(rf"\b{name}\((?P<arg>[^()]*)\)")
            text = use.sub(lambda m, p=param, b=body: re.sub(rf"\b{p}\b", m["arg"], b), text)
    return text


def read_globals(text: str) -> dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]]:
    """Every templated ``__global__`` of a source: name -> (template [(kind, name)], parameters [(ctype, name)]),
    the shared parameter macros (of the source and of the headers in kernels/) expanded."""
    found = {}
    macros = {}
    for header in sorted([*kernels_dir().glob("*.cuh"), *kernels_dir().glob("*.h")]):
        macros |= _parameter_macros(header.read_text())
    macros |= _parameter_macros(text)
    text = _strip_comments(text)
    text = _expand(re.sub(r"^[ \t]*#define[^\n]*(?:\\\n[^\n]*)*", "", text, flags=re.M), macros)
    for match in _GLOBAL.finditer(text):
        rest = match.end()
        if text.startswith("__launch_bounds__", rest):
            _, rest = _balanced(text, text.index("(", rest))
        name_match = re.compile(r"\s*(\w+)\s*").match(text, rest)
        assert name_match is not None
        inside, _ = _balanced(text, name_match.end())
        template = [tuple(t.split()) for t in match.group("template").split(",")]
        params = []
        for piece in inside.split(","):
            words = " ".join(piece.replace("__restrict__", " ").replace("*", "* ").split())
            ctype, _, pname = words.rpartition(" ")
            params.append((ctype.replace(" *", "*"), pname))
        found[name_match.group(1)] = (template, params)
    return found


def _all_globals() -> dict[str, tuple[str, tuple[list, list]]]:
    root = kernels_dir()
    found = {}
    for path in sorted(root.rglob("*.cu")):
        for name, signature in read_globals(path.read_text()).items():
            found[name] = (path.relative_to(root).as_posix(), signature)
    return found


def _declared(kernel: Kernel) -> tuple[list, list]:
    return [(t.kind, t.name) for t in kernel.template], [(p.ctype, p.name) for p in kernel.params]


def test_every_global_is_declared_once_and_every_declaration_exists():
    # A kernel added to kernels/ without a declaration, or a declaration
    # left behind by a removed kernel, fails here.
    found = _all_globals()
    assert sorted(found) == sorted(k.name for k in KERNELS)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_declaration_matches_the_cu_signature(kernel):
    # Name, type and order of every template parameter and parameter.
    source, (template, params) = _all_globals()[kernel.name]
    assert source == kernel.source
    want_template, want_params = _declared(kernel)
    assert template == want_template, f"{kernel.name}: template in {source} {template}, declared {want_template}"
    for i, (got, want) in enumerate(zip(params, want_params, strict=False)):
        assert got == want, f"{kernel.name} parameter {i}: {source} has {got}, declared {want}"
    assert len(params) == len(want_params), f"{kernel.name}: {len(params)} parameters, {len(want_params)} declared"


def test_a_swapped_pair_of_same_typed_parameters_is_seen():
    # The comparison itself: swap batch and total_tokens (both long long) in
    # the parameter list compress's kernels share and the reader sees a
    # different order.
    text = (kernels_dir() / COMPRESS.source).read_text()
    pair = r"long long batch,(\s*\\\n\s*)long long total_tokens"
    swapped = re.sub(pair, r"long long total_tokens,\1long long batch", text)
    assert swapped != text
    _, params = read_globals(swapped)[COMPRESS.name]
    assert params != _declared(COMPRESS)[1]


def test_arguments_come_by_name_at_their_width():
    values = {p.name: (np.zeros(1, np.float32) if p.pointer else 3) for p in COMPRESS.params}
    arguments = COMPRESS.arguments(values)
    widths = {type(a) for a, p in zip(arguments, COMPRESS.params, strict=True) if not p.pointer}
    assert widths == {np.int64}
    with pytest.raises(ValueError, match=r"missing \['batch'\]"):
        COMPRESS.arguments({k: v for k, v in values.items() if k != "batch"})
    with pytest.raises(ValueError, match=r"unknown \['bacth'\]"):
        COMPRESS.arguments({**values, "bacth": 1})
    with pytest.raises(TypeError, match="takes an array"):
        COMPRESS.arguments({**values, "k": 5})


def test_a_scalar_that_does_not_fit_its_parameter_is_refused():
    from kpool_cupy.kernel.declarations import TAIL_UPDATE

    values = {p.name: (np.zeros(1, np.float32) if p.pointer else 1) for p in TAIL_UPDATE.params}
    with pytest.raises(ValueError, match="next_n"):
        TAIL_UPDATE.arguments({**values, "next_n": 2**31})


def test_instance_names_every_template_parameter():
    dtype = np.dtype(np.float32)
    name = COMPRESS.instance(KT=dtype, GT=dtype, OT=dtype, HEAD_DIM=128, KPOOL=4)
    assert name == f"kpool_compress<float, float, float, 128, 4, {int(COMPRESS.aligned)}, 0, int, int, int>"
    with pytest.raises(ValueError, match=r"missing \['KPOOL'\]"):
        COMPRESS.instance(KT=dtype, GT=dtype, OT=dtype, HEAD_DIM=128)


def test_an_instance_name_is_made_once_and_any_value_is_spelled_as_it_comes():
    # Kernel.resolved_instance caches the names by the template's values; a value no cache can hold (a 0-d array)
    # is spelled without it, as it was before the cache.
    dtype = np.dtype(np.float32)
    first = COMPRESS.instance(KT=dtype, GT=dtype, OT=dtype, HEAD_DIM=128, KPOOL=4)
    assert COMPRESS.instance(KT=dtype, GT=dtype, OT=dtype, HEAD_DIM=128, KPOOL=4) is first
    assert COMPRESS.instance(KT=dtype, GT=dtype, OT=dtype, HEAD_DIM=np.array(128), KPOOL=4) == first
