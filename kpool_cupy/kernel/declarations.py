"""Every ``__global__`` function of kernels/, declared once: its file, template parameters and parameters.

From a declaration come the instantiation name (``Kernel.instance``: the
string NVRTC's name expressions, CuPy's ``get_function`` and the emulator's
shim all get) and the argument tuple (``Kernel.arguments``: built from
values given by name, each scalar at its C++ width). Nothing passes a kernel
argument by position, so two swapped parameters of one type cannot go
unnoticed; tests/test_kernel_declarations.py reads each ``__global__``
signature in kernels/ and compares it with its declaration, name by name.

A parameter group that several kernels share (a ring, an FP8 destination)
is declared once here and spliced into each kernel that takes it, in the
order the ``.cu`` signature lists it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dtypes import ELEMENT_CTYPES, INDEX_CTYPES, INT32
from .codes import Fp8Target, VectorAccess

# C++ parameter types a launcher passes as a NumPy scalar, by their width, with the values each holds.
_SCALARS = {"long long": np.int64, "int": np.int32}
_LIMITS = {ctype: (int(np.iinfo(scalar).min), int(np.iinfo(scalar).max)) for ctype, scalar in _SCALARS.items()}


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its name and its C++ type as the ``.cu`` spells it, ``__restrict__`` left out."""

    name: str
    ctype: str

    @property
    def pointer(self) -> bool:
        return self.ctype.endswith("*")


@dataclass(frozen=True)
class TemplateParam:
    """One template parameter: ``typename`` (a dtype), ``int`` or ``bool``, and the value a name takes when the
    caller leaves it out (None: required)."""

    name: str
    kind: str
    default: Any = None


@dataclass(frozen=True)
class Kernel:
    """A ``__global__`` function template of ``kernels/<source>``."""

    name: str
    source: str
    template: tuple[TemplateParam, ...]
    params: tuple[Param, ...]
    aligned: int = 0  # the VECTOR argument with every operand 16-byte accessible (tools' default variant)
    _names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    # Per parameter (name, C++ type, NumPy scalar or None for a pointer, least, most): what ``arguments`` walks.
    _passing: tuple[tuple[str, str, Any, int, int], ...] = field(init=False, repr=False, compare=False)
    # The template parameters' names, and the value each one left out takes (``resolve``).
    _template_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _defaults: dict[str, Any] = field(init=False, repr=False, compare=False)
    _template_set: frozenset[str] = field(init=False, repr=False, compare=False)
    _required: frozenset[str] = field(init=False, repr=False, compare=False)  # template names with no default
    _name_set: frozenset[str] = field(init=False, repr=False, compare=False)
    # Instantiation names by resolved template values (``instance``), made once each.
    _instances: dict[tuple[Any, ...], str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: a parameter is declared twice in {names}")
        object.__setattr__(self, "_names", tuple(names))
        scalars = {p.name: (_SCALARS[p.ctype], *_LIMITS[p.ctype]) for p in self.params if not p.pointer}
        passing = [(p.name, p.ctype, *scalars.get(p.name, (None, 0, 0))) for p in self.params]
        object.__setattr__(self, "_passing", tuple(passing))
        object.__setattr__(self, "_instances", {})
        object.__setattr__(self, "_template_names", tuple(t.name for t in self.template))
        defaults = {t.name: (self.aligned if t.name == "VECTOR" else t.default) for t in self.template}
        object.__setattr__(self, "_defaults", {name: value for name, value in defaults.items() if value is not None})
        object.__setattr__(self, "_template_set", frozenset(self._template_names))
        object.__setattr__(self, "_required", frozenset(self._template_names) - self._defaults.keys())
        object.__setattr__(self, "_name_set", frozenset(names))

    def resolve(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Every template parameter by name: those given, the rest their defaults (index types int32, flags
        off, VECTOR every operand aligned); a required one missing or an unknown name is an error."""
        names, defaults = self._template_names, self._defaults
        if not (values.keys() <= self._template_set and self._required <= values.keys()):
            _require_names(self.name, "template parameter", names, values, defaults)
        return {name: values[name] if name in values else defaults[name] for name in names}

    def instance(self, **values: Any) -> str:
        """``name<...>``: the template parameters (``resolve``), dtypes as the kernels' storage or index C
        types, integers and bools as integers."""
        return self.resolved_instance(self.resolve(values))

    def resolved_instance(self, resolved: Mapping[str, Any]) -> str:
        """``instance`` of template values ``resolve`` gave (every parameter, in order)."""
        key = tuple(resolved.values())
        try:
            spelled = self._instances.get(key)
        except TypeError:  # a value no cache can hold (an array): spelled, or refused, as it is
            return self._spell(key)
        if spelled is None:
            spelled = self._spell(key)
            self._instances[key] = spelled
        return spelled

    def _spell(self, resolved: tuple[Any, ...]) -> str:
        spelled = []
        for t, value in zip(self.template, resolved, strict=True):
            if t.kind == "typename":
                dtype = np.dtype(value)
                spelled.append(ELEMENT_CTYPES.get(dtype) or INDEX_CTYPES[dtype])
            else:
                spelled.append(str(int(value)))
        return f"{self.name}<{', '.join(spelled)}>"

    def arguments(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """The argument tuple in the ``.cu`` order from every parameter by name: arrays as given, ``long long``
        and ``int`` as np.int64 and np.int32 (a value that does not fit is an error, not a wrapped number)."""
        if values.keys() != self._name_set:
            _require_names(self.name, "parameter", self._names, values, {})
        listed = []
        for name, ctype, scalar, least, most in self._passing:
            value = values[name]
            if scalar is None:
                if not hasattr(value, "shape"):
                    raise TypeError(f"{self.name}: parameter {name} ({ctype}) takes an array, got {value!r}")
                listed.append(value)
                continue
            number = int(value)
            if not least <= number <= most:
                raise ValueError(f"{self.name}: parameter {name} ({ctype}) cannot hold {value!r}")
            listed.append(scalar(number))
        return tuple(listed)


def _require_names(kernel: str, what: str, declared: Any, given: Mapping[str, Any], defaults: Mapping[str, Any]):
    missing = [n for n in declared if n not in given and n not in defaults]
    unknown = [n for n in given if n not in declared]
    if missing or unknown:
        raise ValueError(f"{kernel}: {what}s missing {missing}, unknown {unknown}")


def typename(name: str, default: Any = None) -> TemplateParam:
    return TemplateParam(name, "typename", default)


def integer(name: str, default: Any = None) -> TemplateParam:
    return TemplateParam(name, "int", default)


def boolean(name: str) -> TemplateParam:
    return TemplateParam(name, "bool", False)


def index(name: str) -> TemplateParam:
    """An index array's element type, int32 unless given."""
    return typename(name, INT32)


def rows(name: str, ctype: str, stride: str | None = None) -> tuple[Param, ...]:
    """A row-major array and its row stride in elements (``<name>_row_stride`` unless named)."""
    return Param(name, ctype), Param(stride or f"{name}_row_stride", "long long")


def pointers(ctype: str, *names: str) -> tuple[Param, ...]:
    """Parameters of one C++ type, in order."""
    return tuple(Param(n, ctype) for n in names)


def longs(*names: str) -> tuple[Param, ...]:
    return pointers("long long", *names)


# The VECTOR bits of operands every kernel of a kind reads or writes.
_V = VectorAccess
_POOLING = _V.K | _V.GATE | _V.APE
_RINGS = _V.TAIL | _V.GATE_RING

# The element types and sizes every pooling kernel opens its template with.
_ELEMENTS = (typename("KT"), typename("GT"))
_SIZES = (integer("HEAD_DIM"), integer("KPOOL"), integer("VECTOR"))
_RING_ELEMENTS = (typename("T"), typename("G"))

# A ragged batch's requests: each one's first token row and its cached prefix.
_BATCH = (Param("input_row_offsets", "const IO*"), Param("cache_lengths", "const IC*"))
# The pooling inputs of compress and its FP8 form: tokens, ape, offsets.
_COMPRESS_INPUTS = (
    *rows("k", "const KT*"),
    *rows("gate", "const GT*"),
    *rows("ape", "const float*"),
    *_BATCH,
    Param("pool_row_offsets", "const IP*"),
    *longs("batch", "total_tokens", "guess_pools"),
)


def ring(writable: bool) -> tuple[Param, ...]:
    """A ring as every ring kernel takes it (kernels/kpool_ring.cu): key ring, gate ring, the gate ring's
    offset, slots, rows, the key ring's and the gate ring's slot and row strides."""
    const = "" if writable else "const "
    return (
        Param("key_ring", f"{const}T*"),
        Param("gate_ring", f"{const}G*"),
        *longs("gate_offset", "max_slots", "ring_rows", "key_slot_stride", "key_row_stride"),
        *longs("gate_slot_stride", "gate_row_stride"),
    )


# The call's token rows, as ring close and seed tail take them (gate's row
# stride named apart from the ring's).
_RING_TOKENS = (*rows("k", "const T*"), *rows("gate", "const G*", "gate_row_stride_tokens"))
_REQUESTS = (
    *_BATCH,
    Param("slot_idx", "const IS*"),
    *longs("batch", "total_tokens"),
)
# The decode step's tokens [requests, next_n, head_dim] and where they sit.
_STEP = (
    Param("k", "const T*"),
    *longs("k_request_stride", "k_token_stride"),
    Param("gate", "const G*"),
    *longs("gate_request_stride", "gate_token_stride"),
    *rows("ape", "const float*"),
    Param("positions", "const IPOS*"),
    Param("slot_idx", "const IS*"),
    Param("requests", "long long"),
    Param("next_n", "int"),
)

# Power-of-two FP8 scales (kp::fp8_quantize), a template argument so that a
# kernel carries one quantization path; on unless given, as the ops default.
ROUND_SCALE = TemplateParam("ROUND_SCALE", "bool", True)

# Where an FP8 writer's rows go (kp::Fp8Sink in kernels/kpool_fp8.cuh): rows
# of values and scales, or a paged cache through slots or a block table.
FP8_SINK = (
    *rows("values", "unsigned char*", "values_stride"),
    Param("scales", "float*"),
    *longs("target_rows", "block_size"),
    Param("destinations", "const ID*"),
    *longs("destination_rows", "destination_columns", "destination_stride"),
)


def fp8_form(kernel: Kernel) -> Kernel:
    """The FP8 sibling of a pool-writing kernel (``<name>_fp8``, same file): the same pooling, its rows
    written through ``kp::Fp8Sink``. Its template drops the output type, takes TARGET and ROUND_SCALE where
    ROTATE was and the destinations' index type last; its parameters take ``FP8_SINK`` where the pooled
    rows were."""
    template: list[TemplateParam] = []
    for t in kernel.template:
        if t.name == "ROTATE":
            template += [integer("TARGET", int(Fp8Target.ROWS)), ROUND_SCALE]
        elif t.name != "OT":
            template.append(t)
    params: list[Param] = []
    for p in kernel.params:
        if p.name == "pooled":
            params += FP8_SINK
        elif not p.name.startswith("pooled_"):
            params.append(p)
    return Kernel(f"{kernel.name}_fp8", kernel.source, (*template, index("ID")), tuple(params), aligned=kernel.aligned)


COMPRESS = Kernel(
    "kpool_compress",
    "kpool_compress.cu",
    (*_ELEMENTS, typename("OT"), *_SIZES, boolean("ROTATE"), index("IO"), index("IC"), index("IP")),
    (*_COMPRESS_INPUTS, *rows("pooled", "OT*"), Param("pooled_rows", "long long")),
    aligned=_POOLING | _V.OUT,
)
# The backward pass of compress (same file): the pooling inputs, the pooled rows' gradient at any strides,
# the gradients of k and gate (the zero rows of tokens in no pool from its blocks past pool_blocks), and the
# pool blocks' partial sums of ape's gradient; then their sum in a fixed order.
COMPRESS_BACKWARD = Kernel(
    "kpool_compress_backward",
    "kpool_compress.cu",
    (*_ELEMENTS, typename("DT"), *_SIZES, index("IO"), index("IC"), index("IP")),
    (
        *_COMPRESS_INPUTS,
        *rows("grad", "const DT*"),
        *longs("grad_column_stride", "grad_rows"),
        *rows("grad_k", "KT*"),
        *rows("grad_gate", "GT*"),
        Param("partials", "float*"),
        Param("pool_blocks", "long long"),
    ),
    aligned=_POOLING | _V.OUT,
)
COMPRESS_BACKWARD_APE = Kernel(
    "kpool_compress_backward_ape",
    "kpool_compress.cu",
    (integer("HEAD_DIM"), integer("KPOOL")),
    (Param("partials", "const float*"), Param("blocks", "long long"), *rows("grad_ape", "float*")),
)
RING_CLOSE = Kernel(
    "kpool_ring_close",
    "kpool_ring.cu",
    (*_RING_ELEMENTS, typename("OT"), *_SIZES, boolean("ROTATE"), index("IO"), index("IC"), index("IS")),
    (
        *ring(writable=False),
        *_RING_TOKENS,
        *rows("ape", "const float*"),
        *_REQUESTS,
        *rows("pooled", "OT*"),
        Param("closed", "int*"),
    ),
    aligned=_POOLING | _V.OUT | _RINGS,
)
SEED_TAIL = Kernel(
    "kpool_seed_tail",
    "kpool_ring.cu",
    (*_RING_ELEMENTS, integer("HEAD_DIM"), integer("VECTOR"), index("IO"), index("IC"), index("IS")),
    (*ring(writable=True), *_RING_TOKENS, *_REQUESTS),
    aligned=_V.K | _V.GATE | _RINGS,
)
TAIL_UPDATE = Kernel(
    "kpool_tail_update",
    "kpool_ring.cu",
    (*_RING_ELEMENTS, typename("OT"), *_SIZES, boolean("SPLIT"), boolean("ROTATE"), index("IPOS"), index("IS")),
    (*ring(writable=True), *_STEP, Param("pooled", "OT*"), Param("closed", "int*"), Param("pools_per_request", "int")),
    aligned=_POOLING | _V.OUT | _RINGS,
)
COMPRESS_FP8 = fp8_form(COMPRESS)
RING_CLOSE_FP8 = fp8_form(RING_CLOSE)
TAIL_UPDATE_FP8 = fp8_form(TAIL_UPDATE)
# Where an expanded row of positions goes (kernels/kpool_expand.cuh, kp::write_selection): the token KV cache's
# block table, the positions, their width and the counts; expand and both selecting kernels take it last.
_EXPANSION = (
    Param("block_table", "const int*"),
    *longs("max_blocks", "block_table_stride", "block_size"),
    Param("positions", "int*"),
    Param("width", "long long"),
    Param("counts", "int*"),
)
EXPAND_TOPK = Kernel(
    "kpool_expand_topk",
    "kpool_expand.cu",
    (integer("KPOOL"), index("IPID"), index("IO"), index("IC"), boolean("PAGED"), boolean("COMPACT")),
    (
        Param("pool_ids", "const IPID*"),
        Param("pool_topk", "long long"),
        *_BATCH,
        *longs("batch", "total_tokens"),
        *_EXPANSION,
    ),
)
HADAMARD_QUANT_FP8 = Kernel(
    "kpool_hadamard_quant_fp8",
    "kpool_hadamard_quant_fp8.cu",
    (typename("T"), integer("HEAD_DIM"), integer("VECTOR"), ROUND_SCALE),
    (*rows("x", "const T*"), Param("rows", "long long"), *rows("values", "unsigned char*"), Param("scales", "float*")),
    aligned=_V.K | _V.OUT,
)
# The index scorer's VECTOR bits (kernels/kpool_index_logits.cu): cache pages and query rows 16-byte aligned.
INDEX_VECTOR_CACHE = 1
INDEX_VECTOR_Q = 2
# The fused select's third bit on the wgmma path (kernels/kpool_index_select.cu's kTilePages): the cache 16-byte
# aligned and its pages a multiple of 64 pools, so each key tile of 64 lies in one page.
INDEX_TILE_PAGES = 4
# Its fourth (kPaired there): at most 32 heads a token, so two tokens share a wgmma chain's 64 columns.
INDEX_PAIRED_TOKENS = 8
# Its MMA template argument: the tensor-core instruction (kernels/kpool_index.cuh).
MMA_F16 = 0  # f16 mma.sync m16n8k16 after an exact conversion: sm_80 to sm_88
MMA_E4M3 = 1  # e4m3 mma.sync m16n8k32: sm_89 and newer
MMA_WGMMA = 2  # e4m3 wgmma.mma_async m64nNk32 by a warpgroup: sm_90a builds only (Hopper's arch-specific ISA)
# f16 mma.sync m16n8k16 on e4m3 converted once a key tile: sm_90, which has no e4m3 mma.sync (ptxas lowered it to
# f16 HMMAs converting both operands at every instruction, each step's sum added to the accumulator apart)
MMA_E4M3_HMMA = 3


def tensor_core_for(capability: int, sm90a: bool = False) -> int | None:
    """The scorer's tensor-core instruction on a GPU of compute ``capability`` (90 for sm_90): wgmma on 9.0 with
    ``sm90a`` (the arch-specific build), f16 mma.sync on converted e4m3 on 9.0 without it, else e4m3 mma.sync from
    sm_89, f16 on sm_80 to sm_88, None below (no FP8 scorer)."""
    if capability == 90:
        return MMA_WGMMA if sm90a else MMA_E4M3_HMMA
    if capability >= 89:
        return MMA_E4M3
    return MMA_F16 if capability >= 80 else None


def builds_for_sm90a(template: Mapping[str, Any]) -> bool:
    """Whether a kernel instance with these template arguments must be compiled for sm_90a (it issues wgmma),
    not for the device's plain compute capability."""
    return template.get("MMA") == MMA_WGMMA


def scoring_inputs(page_size: str) -> tuple[Param, ...]:
    """What the scorer and the fused select read, in their order: queries, weights, the pooled FP8 cache and its
    pages (the page size named ``page_size``: the fused select's own ``block_size`` is the token table's), the
    requests' offsets and lengths."""
    return (
        Param("q", "const unsigned char*"),
        *longs("q_token_stride", "q_head_stride", "heads"),
        Param("weights", "const float*"),
        Param("weights_stride", "long long"),
        Param("cache", "const unsigned char*"),
        *longs("page_stride", "pages", page_size),
        Param("cache_block_table", "const int*"),
        *longs("table_columns", "table_stride"),
        *_BATCH,
    )


INDEX_LOGITS_FP8 = Kernel(
    "kpool_index_logits_fp8",
    "kpool_index_logits.cu",
    (integer("HEAD_DIM"), integer("MMA", MMA_E4M3), integer("VECTOR"), index("IO"), index("IC")),
    (
        *scoring_inputs("block_size"),
        *longs("batch", "num_tokens", "kpool"),
        Param("out", "float*"),
        *longs("out_stride", "max_pools", "tokens_per_block", "token_tiles", "pools_per_block"),
    ),
    aligned=INDEX_VECTOR_CACHE | INDEX_VECTOR_Q,
)
# The largest pool_topk each instantiation of kpool_index_topk takes (its shared buffer: CAP + 1024 candidates).
SELECT_CAPS = (512, 1024, 2048, 4096)
INDEX_TOPK = Kernel(
    "kpool_index_topk",
    "kpool_index_topk.cu",
    (integer("CAP"), integer("VECTOR"), index("IO"), index("IC"), boolean("PAGED"), boolean("COMPACT")),
    (
        Param("logits", "const float*"),
        *longs("logits_stride", "logits_width"),
        *_BATCH,
        *longs("batch", "num_tokens", "kpool", "pool_topk"),
        *_EXPANSION,
        Param("workspace", "unsigned char*"),
        Param("splits", "long long"),
    ),
    aligned=1,
)
INDEX_SELECT_FP8 = Kernel(
    "kpool_index_select_fp8",
    "kpool_index_select.cu",
    (
        integer("HEAD_DIM"),
        integer("MMA", MMA_E4M3),
        integer("VECTOR"),
        integer("CAP"),
        index("IO"),
        index("IC"),
        boolean("PAGED"),
        boolean("COMPACT"),
    ),
    (
        *scoring_inputs("cache_block_size"),
        *longs("batch", "num_tokens", "kpool", "pool_topk"),
        *_EXPANSION,
        Param("workspace", "unsigned char*"),
        *longs("splits", "group_tokens"),
    ),
    aligned=INDEX_VECTOR_CACHE | INDEX_VECTOR_Q,
)
# The benchmark's baseline (kernels/bench/): upstream's geometry, one thread per channel.
COMPRESS_BASELINE = Kernel(
    "kpool_compress_baseline",
    "bench/kpool_compress_baseline.cu",
    (typename("T"), integer("HEAD_DIM"), integer("KPOOL")),
    (
        *pointers("const T*", "k", "gate"),
        Param("ape", "const float*"),
        *pointers("const long long*", "input_row_offsets", "cache_lengths", "pool_row_offsets"),
        Param("batch", "long long"),
        Param("pooled", "T*"),
    ),
)

KERNELS: tuple[Kernel, ...] = (
    COMPRESS,
    COMPRESS_FP8,
    COMPRESS_BACKWARD,
    COMPRESS_BACKWARD_APE,
    RING_CLOSE,
    RING_CLOSE_FP8,
    SEED_TAIL,
    TAIL_UPDATE,
    TAIL_UPDATE_FP8,
    EXPAND_TOPK,
    HADAMARD_QUANT_FP8,
    INDEX_LOGITS_FP8,
    INDEX_TOPK,
    INDEX_SELECT_FP8,
    COMPRESS_BASELINE,
)
