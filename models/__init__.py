"""The model zoo: seeded random-weight models at fixed sizes, their example inputs, and ONNX export.

`build("gpt2", "tiny")` returns an eval-mode model and example inputs; sizes are "tiny" (CI, well
under a second per forward on a small CPU), "small", and "bench" (the benchmark plan's real shapes —
never allocate those in tests).
"""

from __future__ import annotations

import os

import torch

from . import bert, gpt2, llama, mlp, resnet, vit
from .common import ModelSpec, randomize_norms, seeded
from .export import export_module

__all__ = ["ZOO", "ModelSpec", "build", "example_inputs", "export_onnx", "input_names", "output_names"]

ZOO: dict[str, ModelSpec] = {m.SPEC.name: m.SPEC for m in (mlp, gpt2, llama, bert, resnet, vit)}


class UnknownModel(KeyError, ValueError):
    """A zoo model or size that does not exist: a KeyError (a lookup) and a ValueError (what the command line reports
    as an error, not a traceback)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown zoo model"


def _spec(name: str, size: str | None = None) -> ModelSpec:
    if name not in ZOO:
        raise UnknownModel(f"unknown zoo model {name!r}; the zoo has {sorted(ZOO)}")
    spec = ZOO[name]
    if size is not None and size not in spec.sizes:
        raise UnknownModel(f"zoo model {name!r} has no size {size!r}; it has {sorted(spec.sizes)}")
    return spec


def build(
    name: str,
    size: str = "tiny",
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Build zoo model `name` at `size` with weights seeded by `seed`; return (model, example inputs).

    Weights are drawn on the CPU in float32 and then moved, so a seed gives the same model on every
    device and in every dtype. The model is in eval mode with gradients off. The example inputs are
    random too, drawn from `seed` so a call is reproducible (use `example_inputs` for fresh ones).
    """
    spec = _spec(name, size)
    with seeded(seed):
        model = spec.builder(**spec.sizes[size])
        randomize_norms(model)
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    return model, example_inputs(name, size, dtype=dtype, device=device, seed=seed + 1)


def example_inputs(
    name: str,
    size: str = "tiny",
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """Random example inputs for zoo model `name` at `size`: float inputs in `dtype`, integer ones int64.

    With `seed=None` the values are fresh on every call; float inputs are never all zeros and integer
    ids stay inside the vocabulary.
    """
    spec = _spec(name, size)
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    tensors = spec.make_inputs(spec.sizes[size], spec.shapes[size], dtype, generator)
    return tuple(t.to(device) for t in tensors)


def input_names(name: str) -> list[str]:
    """Names of the model's inputs, in forward-argument order (also the ONNX graph input names)."""
    return list(_spec(name).input_names)


def output_names(name: str) -> list[str]:
    """Names of the model's outputs (also the ONNX graph output names)."""
    return list(_spec(name).output_names)


def export_onnx(
    name: str,
    path: str | os.PathLike,
    size: str = "tiny",
    *,
    opset: int = 18,
    dynamic_batch: bool = False,
) -> str:
    """Build zoo model `name` at `size` (seed 0, float32, CPU) and export it to the ONNX file `path`.

    Graph inputs and outputs are named as `input_names(name)` and `output_names(name)`; with
    `dynamic_batch` their dim 0 is the symbolic dim "batch". Returns `path` as a string.
    """
    model, inputs = build(name, size)
    return export_module(
        model, inputs, path, input_names(name), output_names(name), opset=opset, dynamic_batch=dynamic_batch
    )
