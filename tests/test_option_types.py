"""A bool option takes True or False (a NumPy bool too) and nothing else, on every op and backend.

A string "False" reads as true and an array raises NumPy's "truth value is
ambiguous" naming no argument; both are refused up front with a TypeError
that names the option.
"""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16

from kpool_cupy import emulate, reference
from kpool_cupy.ops import OPS
from kpool_cupy.ops.framework.binding import check_bool_options
from kpool_cupy.ops.framework.spec import REQUIRED

BACKENDS = {"emulate": emulate, "reference": reference}
BOOL_OPTIONS = [(spec, o.name) for spec in OPS for o in spec.options if o.annotation == "bool"]


@pytest.mark.parametrize(("spec", "name"), BOOL_OPTIONS, ids=[f"{s.name}-{n}" for s, n in BOOL_OPTIONS])
@pytest.mark.parametrize("value", ["False", 0, 1, None, np.array([True, False]), np.array(True)], ids=repr)
def test_every_bool_option_of_every_op_refuses_anything_but_a_bool(spec, name, value):
    options = {o.name: (1 if o.default is REQUIRED else o.default) for o in spec.options}
    with pytest.raises(TypeError, match=f"Invalid {name}: expected True or False"):
        check_bool_options(spec, {**options, name: value})
    check_bool_options(spec, {**options, name: np.bool_(True)})  # NumPy's bool is a bool


def _compress_arguments():
    rng = np.random.default_rng(0)
    k = rng.standard_normal((8, 16)).astype(BF16)
    ape = rng.standard_normal((4, 16)).astype(np.float32)
    return k, k.copy(), ape, np.array([0, 8], np.int64), np.array([0], np.int64)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(
    ("function", "keyword", "value"),
    [
        ("kpool_compress", "rotate", "False"),
        ("kpool_compress_fp8", "round_scale", "False"),
        ("kpool_compress_fp8", "round_scale", np.array([True, False])),
        ("kpool_compress", "validate", "no"),
        ("kpool_expand_topk", "compact", "no"),
    ],
)
def test_a_call_with_a_string_or_array_for_a_bool_is_refused_naming_it(backend, function, keyword, value):
    module = BACKENDS[backend]
    if function == "kpool_expand_topk":
        args, fixed = (np.zeros((8, 2), np.int32), np.array([0, 8], np.int64), np.array([0], np.int64)), {"kpool": 4}
    else:
        args, fixed = _compress_arguments(), {}
    with pytest.raises(TypeError, match=f"Invalid {keyword}: expected True or False"):
        getattr(module, function)(*args, **fixed, **{keyword: value})
