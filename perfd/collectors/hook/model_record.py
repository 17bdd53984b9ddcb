"""A hook's model record (perfd.hook.wire.KIND_MODEL) taken into the job's spec: each size the record
states and perfd.core.bounds admits replaces the spec's; one out of bounds is left out and said. The spec is
what the analysis divides the hook's stated FLOPs by (perfd.analytics.steps.flops.flops_split)."""

from __future__ import annotations

from perfd.core.bounds import SPEC_BOUNDS, in_bounds
from perfd.core.model import ModelSpec
from perfd.hook import wire


def take_model(spec: ModelSpec, m: wire.ModelMsg) -> list[str]:
    """Set ``spec``'s fields from ``m``; returns one reason per value left out (out of bounds)."""
    problems: list[str] = []
    for name, value in m.sizes.items():
        if value is None:
            continue
        if name in SPEC_BOUNDS and not in_bounds(value, *SPEC_BOUNDS[name]):
            problems.append(f"{name}={value}")
            continue
        setattr(spec, name, value)
    n = m.parameter_count
    if n is not None:
        if in_bounds(n, *SPEC_BOUNDS["parameter_count"]):
            spec.parameter_count = n
        else:
            problems.append(f"parameter_count={n}")
    spec.swiglu, spec.untie_embeddings = m.swiglu, m.untie_embeddings
    spec.multi_latent_attention = m.multi_latent_attention
    return problems
