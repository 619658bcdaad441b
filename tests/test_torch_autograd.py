"""torch.ops.kpool.compress under autograd: its gradients are kpool_compress_backward's, eager and compiled.

compress's spec declares its gradient (``OpSpec.gradient``: the backward op
``kpool_compress_backward``, the inputs k, gate and ape, ``rotate`` refused),
and the torch layer registers it on the default overload alone; every other
overload and op still refuses a gradient (tests/test_torch_ops.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from model import BF16, F16, F32

torch = pytest.importorskip("torch")

import kpool_cupy.torch as kt  # noqa: E402  (after the skip)
from kpool_cupy import reference  # noqa: E402
from kpool_cupy.ops.framework.spec import OpSpec  # noqa: E402
from kpool_cupy.torch.schema import SPECS as OPS  # noqa: E402
from kpool_cupy.torch.tensors import to_numpy, torch_dtype  # noqa: E402

HEAD_DIM = 16
# A ragged batch: cached prefixes at several phases mod kpool, a request that completes no pool, tokens
# before the first complete pool and after the last (they get zero gradient).
LENGTHS, CACHED = [9, 1, 14, 6], [3, 2, 0, 5]


@pytest.fixture(autouse=True)
def _compile_afresh():
    # Inductor's on-disk caches key compiled graphs without the custom ops'
    # Python (as in tests/test_torch_ops.py).
    import torch.compiler.config

    with torch.compiler.config.patch(force_disable_caches=True):
        yield


def batch(dtype: np.dtype, kpool: int = 4, head_dim: int = HEAD_DIM, seed: int = 0, lengths=LENGTHS, cached=CACHED):
    """k, gate (in ``dtype``), a float32 ape and the offsets and lengths, as CPU tensors."""
    g = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    k = torch.randn(tokens, head_dim, generator=g).to(torch_dtype(dtype))
    gate = (3 * torch.randn(tokens, head_dim, generator=g)).to(torch_dtype(dtype))  # weights far from uniform
    ape = torch.randn(kpool, head_dim, generator=g)
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    return k, gate, ape, offsets, torch.tensor(cached, dtype=torch.int32)


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def _host(tensor):
    return to_numpy("tensor", tensor.detach())


def _same_bits(got: torch.Tensor, want: np.ndarray, name: str) -> None:
    got = _host(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape, want.shape)
    if got.tobytes() != want.tobytes():
        row, channel = np.argwhere(got.view(np.uint8) != want.view(np.uint8))[0]
        raise AssertionError(
            f"{name}: row {row}, channel {channel}: got {got[row, channel]}, want {want[row, channel]}"
        )


def test_compress_declares_its_gradient_and_the_backward_op_fits_it():
    # The torch layer reads this declaration, not op names: it must name an op
    # of OPS whose results are the inputs' gradients and whose operands take
    # the forward's inputs and each result's gradient.
    declared = {spec.name: spec for spec in OPS if spec.gradient is not None}
    assert set(declared) == {"kpool_compress"}
    for spec in declared.values():
        gradient = spec.gradient
        backward: OpSpec = next(s for s in OPS if s.name == gradient.op)
        assert len(backward.results) == len(gradient.inputs)
        assert len(gradient.outputs) == len(spec.results)
        taken = {o.name for o in backward.operands if not o.written} - set(gradient.outputs)
        assert taken <= set(spec.operand_names) and set(gradient.inputs) <= set(spec.operand_names)
        assert set(gradient.refused) <= {o.name for o in spec.options}
        assert backward.gradient is None  # no double backward


@pytest.mark.filterwarnings("ignore:Input #\\d+ requires gradient and is not a double precision")
@pytest.mark.parametrize("kpool", [2, 3, 4])
def test_gradcheck_through_the_cpu_op_in_float32(kpool):
    # The kernels take no float64, so the finite differences run in float32
    # (eps 1e-2): each pooled value rounds to 2^-24 of itself and the float32
    # arithmetic errs by a few ulps (|k| < 5: about 1e-6), which the central
    # difference divides by 2 eps = 0.02 (<= 1e-4); its truncation error
    # eps^2 / 6 |f'''| is about 1e-5 at these logits. Measured worst: 2.8e-5
    # (kpool 2 to 4, head_dim 8); atol 2e-4 leaves room, and a wrong
    # gradient (a swapped k and gate, a lost "- pooled") is off by O(1).
    k, gate, ape, offsets, cached = batch(F32, kpool, head_dim=8)

    def pooled(k, gate, ape):
        return torch.ops.kpool.compress(k, gate, ape, offsets, cached)

    assert pooled(k, gate, ape).shape[0] >= 4  # several pools in the batch
    assert torch.autograd.gradcheck(pooled, tuple(_leaves(k, gate, ape)), eps=1e-2, atol=2e-4, rtol=1e-3)


def _loss_gradients(k, gate, ape, offsets, cached, w, **options):
    """d loss / d (k, gate, ape) of ``loss = (compress(...) * w).sum()``, eager."""
    leaves = _leaves(k, gate, ape)
    pooled = torch.ops.kpool.compress(*leaves, offsets, cached, **options)
    (pooled * w).sum().backward()
    return pooled, [t.grad for t in leaves]


@pytest.mark.parametrize("out_dtype", [None, torch.float32], ids=["out-like-k", "out-f32"])
@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
def test_a_models_gradients_are_the_references_bit_for_bit(dtype, out_dtype):
    # The gradient reaches compress in the forward's output dtype (w
    # rounded to it), and the backward op on CPU is the NumPy reference.
    k, gate, ape, offsets, cached = batch(dtype)
    w = torch.randn(5, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    pooled, grads = _loss_gradients(k, gate, ape, offsets, cached, w, out_dtype=out_dtype)
    assert pooled.shape == (5, HEAD_DIM)
    grad_pooled = w.to(pooled.dtype)
    want = reference.kpool_compress_backward(*map(_host, (grad_pooled, k, gate, ape, offsets, cached)))
    for name, got, wanted in zip(("k", "gate", "ape"), grads, want, strict=True):
        _same_bits(got, wanted, f"d {name}")
    assert grads[0].dtype == k.dtype and grads[1].dtype == gate.dtype and grads[2].dtype == torch.float32


def _backward_calls(run):
    """The calls of torch.ops.kpool.compress_backward that ``run()`` makes: (args, kwargs) each."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Calls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.kpool.compress_backward.default:
                seen.append((args, kwargs or {}))
            return func(*args, **(kwargs or {}))

    with Calls():
        run()
    return seen


@pytest.mark.parametrize(
    ("loss", "strides"),
    [
        (lambda pooled: pooled.sum(), (0, 0)),  # an expanded gradient: one element for every row
        (lambda pooled: (pooled.T * torch.arange(5.0)).sum(), (1, 5)),  # column-major
    ],
    ids=["expanded", "transposed"],
)
def test_a_gradient_at_any_strides_is_taken_as_it_comes(loss, strides):
    # Autograd hands compress the gradient its consumer made: stride 0 from a
    # sum, a transposed one from .T; the backward op reads them as they are.
    k, gate, ape, offsets, cached = batch(BF16)
    leaves = _leaves(k, gate, ape)
    pooled = torch.ops.kpool.compress(*leaves, offsets, cached, out_dtype=torch.float32)  # no cast in between
    ((args, _),) = _backward_calls(lambda: loss(pooled).backward())
    assert args[0].stride() == strides  # handed to the backward op as it came, no copy
    grad = np.ascontiguousarray(_host(args[0]))
    want = reference.kpool_compress_backward(grad, *map(_host, (k, gate, ape, offsets, cached)))
    for name, leaf, wanted in zip(("k", "gate", "ape"), leaves, want, strict=True):
        _same_bits(leaf.grad, wanted, f"d {name}")


def model_pooled(k, gate, ape, lengths, cached):
    """The plain float64 model: per pool, the softmax over its members per channel of gate + ape (no
    max-subtraction), the weighted sum of k; torch autograd differentiates it."""
    kpool = ape.shape[0]
    rows, start = [], 0
    for n, c in zip(lengths, cached, strict=True):
        for q in range(-(-c // kpool), (c + n) // kpool):
            members = start + q * kpool - c + torch.arange(kpool)
            weights = torch.exp(gate[members] + ape)
            rows.append((weights * k[members]).sum(dim=0) / weights.sum(dim=0))
        start += n
    return torch.stack(rows)


# A gradient rounded once to its dtype: half an ulp of it, at most 2^-8
# (bf16) and 2^-11 (f16) relative; a full ulp (2^-7, 2^-10, as in
# tests/model.py) leaves room for the float32 error before the rounding to
# tip it; float32 gradients (ape's always) round as the arithmetic before
# them does, which the atol below covers.
RTOL = {BF16: 2.0**-7, F16: 2.0**-10, F32: 2.0**-22}


@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
def test_gradients_are_close_to_autograd_of_a_float64_model(dtype):
    k, gate, ape, offsets, cached = batch(dtype, seed=2)
    w = torch.randn(5, HEAD_DIM, generator=torch.Generator().manual_seed(3))
    _, grads = _loss_gradients(k, gate, ape, offsets, cached, w)
    leaves = _leaves(k.double(), gate.double(), ape.double())
    (model_pooled(*leaves, LENGTHS, CACHED) * w.to(k.dtype).double()).sum().backward()  # w as compress gets it
    # The bound, from the float32 arithmetic of d gate = w g (k - pooled), the
    # worst of the three: with G = max|g|, K = max(max|k|, 1), L = max|gate +
    # ape|, a weight errs by (L + 3) 2^-24 of itself (tests/model.py), the
    # recomputed pool by (2 kpool + L + 8) K 2^-23 (the README's bound), the
    # subtraction and two products by 2^-24 each: G K 2^-23 (2 L + 2 kpool +
    # 14) in all, taken as (3 L + 2 kpool + 20) for slack. d k = w g errs by
    # less. d ape sums P pools' d gate in float32: P times that, plus P
    # roundings of a sum at most P G 2 K.
    kpool, pools = ape.shape[0], 5
    big_g, big_k = float(w.to(k.dtype).abs().max()), max(float(k.abs().max()), 1.0)
    big_l = float((gate.float()[None] + ape[:, None]).abs().max())
    atol = big_g * big_k * (3 * big_l + 2 * kpool + 20) * 2.0**-23
    bounds = {"k": atol, "gate": atol, "ape": pools * atol + pools * pools * big_g * big_k * 2.0**-23}
    for (name, bound), got, want in zip(bounds.items(), grads, leaves, strict=True):
        rtol = RTOL[F32 if name == "ape" else dtype]
        got64, want64 = got.double(), want.grad
        bad = ~((got64 - want64).abs() <= bound + rtol * want64.abs())
        if bad.any():
            row, channel = (int(i) for i in bad.nonzero()[0])
            raise AssertionError(
                f"d {name}: row {row}, channel {channel}: got {float(got64[row, channel])}, "
                f"want {float(want64[row, channel])} (atol {bound:.3g}, rtol {rtol:.3g})"
            )


def test_the_backward_validates_as_the_forward_did_and_gets_its_pool_row_offsets():
    # The backward takes the forward's inputs and its validate: a forward that
    # skipped validation (a hot path) has a backward that skips it too.
    k, gate, ape, offsets, cached = batch(F32)
    pools = torch.ops.kpool.pool_row_offsets(offsets, cached, 4)
    for validate in (True, False):
        leaves = _leaves(k, gate, ape)
        pooled = torch.ops.kpool.compress(*leaves, offsets, cached, pool_row_offsets=pools, validate=validate)
        ((args, kwargs),) = _backward_calls(pooled.sum().backward)
        assert kwargs.get("validate", True) is validate and kwargs["pool_row_offsets"] is pools
        assert all(a is b for a, b in zip(args[1:], (*leaves, offsets, cached), strict=True))  # saved as given


def test_opcheck_of_the_backward_op_and_the_differentiable_compress():
    # opcheck's test_aot_dispatch_dynamic runs the backward under AOTAutograd
    # and compares its gradients with eager's; test_autograd_registration
    # checks the autograd kernel is there.
    for dtype in (BF16, F32):
        k, gate, ape, offsets, cached = batch(dtype)
        leaves = _leaves(k, gate, ape)
        for options in ({}, {"out_dtype": torch.float32}):
            result = torch.library.opcheck(torch.ops.kpool.compress.default, (*leaves, offsets, cached), options)
            assert set(result.values()) == {"SUCCESS"}, (dtype, options, result)
        parameter = (k, gate, torch.nn.Parameter(ape), offsets, cached)  # ape alone requires grad
        result = torch.library.opcheck(torch.ops.kpool.compress.default, parameter)
        assert set(result.values()) == {"SUCCESS"}, result
        for grad in (torch.randn(5, HEAD_DIM).to(k.dtype), torch.ones((), dtype=k.dtype).expand(5, HEAD_DIM)):
            result = torch.library.opcheck(
                torch.ops.kpool.compress_backward.default, (grad, k, gate, ape, offsets, cached)
            )
            assert set(result.values()) == {"SUCCESS"}, (dtype, grad.stride(), result)


class _Pooler(torch.nn.Module):
    """A model's pooling layer: the ape a Parameter, the loss a weighted sum of the pools."""

    def __init__(self, kpool: int) -> None:
        super().__init__()
        self.ape = torch.nn.Parameter(torch.randn(kpool, HEAD_DIM, generator=torch.Generator().manual_seed(5)))

    def forward(self, k, gate, offsets, cached, w):
        pooled = torch.ops.kpool.compress(k, gate, self.ape, offsets, cached)
        return (pooled * w[: pooled.shape[0]]).sum()  # w has a row for every token; the pools use the first


def _training_batch(requests: int):
    g = torch.Generator().manual_seed(requests)
    lengths = torch.randint(1, 12, (requests,), generator=g).tolist()
    cached = torch.randint(0, 9, (requests,), generator=g).tolist()
    k, gate, _, offsets, cached = batch(BF16, seed=requests, lengths=lengths, cached=cached)
    w = torch.randn(sum(lengths), HEAD_DIM, generator=g)
    return _leaves(k, gate), offsets, cached, w


def test_a_compiled_model_trains_over_three_batch_sizes_with_at_most_two_compiles():
    # fullgraph: no graph break in the forward; the backward graph is
    # AOTAutograd's, compress_backward's fake kernel giving its shapes. The
    # pool count is an unbacked size, the batch sizes symbolic after the
    # first recompile: three sizes, at most two compiles.
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")  # AOTAutograd's joint graph, without inductor's codegen
    module = _Pooler(4)
    compiled = torch.compile(module, backend=counter, fullgraph=True)
    for requests in (2, 3, 5):
        (k, gate), offsets, cached, w = _training_batch(requests)
        compiled(k, gate, offsets, cached, w).backward()
        got = [k.grad, gate.grad, module.ape.grad]
        module.zero_grad(set_to_none=True)
        (ek, egate), *_ = _training_batch(requests)
        module(ek, egate, offsets, cached, w).backward()
        want = [ek.grad, egate.grad, module.ape.grad]
        module.zero_grad(set_to_none=True)
        for name, a, b in zip(("k", "gate", "ape"), got, want, strict=True):
            assert a is not None and torch.equal(a, b), (requests, name)
    assert counter.frame_count <= 2, counter.frame_count


def test_rotate_under_autograd_is_refused_naming_rotate():
    # Decision: rotate=True has no backward. The forward runs (an inference
    # model whose ape is a Parameter, in grad mode, as every op without a
    # gradient does); asking for the gradient raises, naming rotate.
    k, gate, ape, offsets, cached = batch(BF16)
    leaves = _leaves(k, gate, ape)
    rotated = torch.ops.kpool.compress(*leaves, offsets, cached, rotate=True)
    want = reference.kpool_compress(*map(_host, (k, gate, ape, offsets, cached)), rotate=True)
    _same_bits(rotated, want, "rotated")
    with pytest.raises(RuntimeError, match=r"^kpool::compress with rotate=True is not differentiable"):
        rotated.float().sum().backward()
    with torch.no_grad():
        _same_bits(torch.ops.kpool.compress(*leaves, offsets, cached, rotate=True), want, "rotated under no_grad")


def test_the_out_overload_and_the_ops_without_a_gradient_still_refuse_one():
    k, gate, ape, offsets, cached = batch(BF16)
    leaves = _leaves(k, gate, ape)
    out = torch.zeros(5, HEAD_DIM, dtype=torch.bfloat16)
    kt.kpool_compress(*leaves, offsets, cached, out=out)  # .out: written in place, not tracked
    assert out.grad_fn is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.float().sum().backward()
    # Tail update declares no gradient: its backward names it.
    tail = torch.zeros(2, 2, 5, HEAD_DIM, dtype=torch.bfloat16)  # kpool + next_n - 1 rows
    step = torch.randn(1, 2, HEAD_DIM).to(torch.bfloat16)
    positions, slots = torch.tensor([[2, 3]], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    pooled, closed = kt.kpool_tail_update(tail, step, step, leaves[2], positions, slots)
    with pytest.raises(RuntimeError, match=r"kpool::tail_update is not differentiable"):
        pooled.float().sum().backward()
    # Its results are its own tensors (a hostile round: a view of the Function's input, which in-place changes
    # refuse): an inference step may scale them in place, and the backward still names the op.
    want = pooled.detach() * 2
    pooled, closed = kt.kpool_tail_update(tail, step, step, leaves[2], positions, slots)
    pooled.mul_(2)
    closed.add_(1)  # ids: never tracked
    assert torch.equal(pooled.detach(), want) and not pooled._is_view() and not closed.requires_grad
    with pytest.raises(RuntimeError, match=r"kpool::tail_update is not differentiable"):
        pooled.float().sum().backward()


def test_a_zero_gradient_passes_a_non_differentiable_op_compiled_or_not_and_any_other_raises():
    # helper-58's findings: compiled, the no-gradient backward ran where eager runs none (a result the loss does
    # not use gets a tangent of zeros), and a float8 result that nothing used moved it into the compiled forward:
    # both raised in steps that run eagerly. A gradient of zeros now gives zeros (whatever the op's derivative);
    # float8 results carry none; a gradient other than zero still raises, naming the op.
    x = torch.randn(16, 64, requires_grad=True)
    quantize = torch.ops.kpool.hadamard_quant_fp8

    def scales_only(x):  # the float8 values unused
        return quantize(x, out_dtype=torch.float8_e4m3fn)[1] * 2

    def logged(x):  # the loss does not use the op's result, which is returned for logging
        return (x * x).sum(), quantize(x)[1]

    for compiled in (False, True):
        torch._dynamo.reset()
        run = (lambda f: torch.compile(f, backend="aot_eager", fullgraph=True)) if compiled else (lambda f: f)
        assert torch.equal(run(scales_only)(x), quantize(x.detach())[1] * 2), compiled
        x.grad = None
        loss, _ = run(logged)(x)
        loss.backward()
        assert torch.equal(x.grad, 2 * x.detach()), compiled  # the loss's own gradient, nothing from the op
        values, scales = quantize(x, out_dtype=torch.float8_e4m3fn)
        assert not values.requires_grad and scales.requires_grad
        x.grad = None
        (scales * 0).sum().backward()  # zeros reach the op: zeros leave it
        assert torch.equal(x.grad, torch.zeros_like(x))
        with pytest.raises(RuntimeError, match=r"^kpool::hadamard_quant_fp8 is not differentiable"):
            run(lambda x: quantize(x)[1].sum())(x).backward()


def test_a_second_derivative_is_refused_naming_the_backward_op():
    # compress_backward declares no gradient of its own.
    k, gate, ape, offsets, cached = batch(F32)
    leaves = _leaves(k, gate, ape)
    pooled = torch.ops.kpool.compress(*leaves, offsets, cached)
    (d_k,) = torch.autograd.grad((pooled * pooled).sum(), leaves[0], create_graph=True)
    with pytest.raises(RuntimeError, match=r"kpool::compress_backward is not differentiable"):
        d_k.sum().backward()


@pytest.mark.filterwarnings("ignore:.torch.jit.script. is deprecated:DeprecationWarning")  # torch.func's own imports
def test_forward_mode_ad_is_refused_naming_the_op_not_dropped():
    # A hostile round: forward-mode AD through compress gave zero derivatives (jacfwd, jvp) or a None tangent
    # (make_dual), with no error: the op ran below autograd and dropped the tangent.
    import torch.autograd.forward_ad as fwad
    import torch.func

    k, gate, ape, offsets, cached = batch(F32)

    def pooled(e):
        return torch.ops.kpool.compress(k, gate, e, offsets, cached)

    for tracked in (False, True):  # the dual input with and without requires_grad
        with fwad.dual_level():
            dual = fwad.make_dual(ape.clone().requires_grad_(tracked), torch.ones_like(ape))
            with pytest.raises(RuntimeError, match=r"^kpool::compress has no forward-mode derivative"):
                pooled(dual)
            plain = pooled(ape)  # no tangent on any input: the call runs as always
            assert fwad.unpack_dual(plain).tangent is None
    _same_bits(plain, reference.kpool_compress(*(_host(t) for t in (k, gate, ape, offsets, cached))), "dual level")
    with fwad.dual_level():  # an op without a gradient refuses a tangent by its own name
        x = torch.randn(6, 128)
        with pytest.raises(RuntimeError, match=r"^kpool::hadamard_quant_fp8 is not differentiable: forward-mode"):
            kt.hadamard_quant_fp8(fwad.make_dual(x, torch.ones_like(x)))
    # torch.func's transforms of a derivative cannot reach the op's Function: a refusal that names the op
    # (torch's own message named none); vmap of the op itself runs.
    for transform in (
        lambda: torch.func.jvp(pooled, (ape,), (torch.ones_like(ape),)),
        lambda: torch.func.jacfwd(pooled)(ape),
        lambda: torch.func.grad(lambda e: pooled(e).sum())(ape),
        lambda: torch.func.vjp(pooled, ape),
    ):
        with pytest.raises(RuntimeError, match=r"^kpool::compress under a torch\.func transform"):
            transform()
    # Only a tangent that reaches the op is refused: jvp and jacfwd with respect to something else run (a
    # review found every kpool op refused inside them), and so does a no-grad op in a dual level, whose ring
    # requires grad, under no_grad (its in-place write is refused only in grad mode, as outside a dual level).
    x = torch.randn(3)
    weighted = torch.func.jvp(lambda z: z * pooled(ape).sum(), (x,), (torch.ones_like(x),))[1]
    assert torch.equal(weighted, pooled(ape).sum().expand(3))
    assert torch.equal(torch.func.jacfwd(lambda z: z * pooled(ape).sum())(x), torch.diag(weighted))
    tail = torch.zeros(2, 2, 5, HEAD_DIM, requires_grad=True)  # kpool + next_n - 1 rows
    step = torch.randn(1, 2, HEAD_DIM)
    positions, slots = torch.tensor([[2, 3]], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    with fwad.dual_level(), torch.no_grad():
        kt.kpool_tail_update(tail, step, step, ape, positions, slots)
    batched = torch.func.vmap(pooled)(torch.stack([ape, 2 * ape]))
    _same_bits(batched[1], reference.kpool_compress(*(_host(t) for t in (k, gate, 2 * ape, offsets, cached))), "vmap")
