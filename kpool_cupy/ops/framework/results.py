"""What an op returns in each of its forms, from its spec: the outputs a caller may hand it, a cache that
takes the place of some (the FP8 ops), and results returned only with an option set (expand's counts)."""

from __future__ import annotations

from .spec import Operand, OpSpec


def given_outputs(spec: OpSpec) -> tuple[Operand, ...]:
    """The outputs a caller may hand the op (optional operands it writes, a cache that replaces some aside)."""
    return tuple(o for o in spec.operands if o.optional and o.written and not o.replaces and not o.scratch)


def cache_target(spec: OpSpec) -> Operand | None:
    """The array the op may write in place of some outputs (``Operand.replaces``), if any."""
    return next((o for o in spec.operands if o.replaces), None)


def output_keys(spec: OpSpec, results: tuple[str, ...]) -> tuple[str, ...]:
    """The ``OpSpec.outputs`` entry behind each result: the output operand it fills (``pooled`` is ``out``),
    the n-th result the n-th output, where the op can be handed its outputs; else the result's own name."""
    outputs = given_outputs(spec)
    if not outputs:
        return results
    return tuple(outputs[all_results(spec).index(r)].name for r in results)


def remaining_results(spec: OpSpec) -> tuple[str, ...]:
    """The results an op writing its cache still returns: those whose outputs the cache does not replace."""
    target = cache_target(spec)
    replaced = target.replaces if target is not None else ()
    return tuple(r for r in spec.results if output_keys(spec, (r,))[0] not in replaced)


def all_results(spec: OpSpec) -> tuple[str, ...]:
    """Every result a default overload returns: a schema has one return type, so a result the op returns
    only with an option set (``OpSpec.conditional_results``) is always there, empty without it."""
    return (*spec.results, *spec.conditional_results)


def conditional_outputs(spec: OpSpec) -> dict[str, str]:
    """The outputs a caller hands only with an option set, and that option (expand's ``counts``: ``compact``)."""
    if not given_outputs(spec):
        return {}
    names = output_keys(spec, tuple(spec.conditional_results))
    return dict(zip(names, spec.conditional_results.values(), strict=True))
