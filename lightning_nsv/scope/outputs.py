"""The outputs a result file records so that :func:`~lightning_nsv.artifacts.reproduce` notices a network that computes
something else: the analysed function on at most :data:`OUTPUT_SAMPLES` evenly spaced training samples."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_nsv.kernel.formulas import forward_with_slopes
from lightning_nsv.kernel.network import PathNetwork
from lightning_nsv.models.layers import eval_mode

__all__ = ["OUTPUT_SAMPLES", "module_device", "module_inputs", "module_outputs", "network_outputs", "output_indices"]

OUTPUT_SAMPLES = 4096  # network outputs saved on at most this many training samples (evenly spaced)


def output_indices(m: int, max_samples: int = OUTPUT_SAMPLES) -> Tensor:
    """At most ``max_samples`` evenly spaced indices into ``m`` training samples (the first and the last included)."""
    return torch.linspace(0, m - 1, min(m, max_samples)).round().to(torch.int64).unique()


def network_outputs(net: PathNetwork, x: Tensor, max_samples: int = OUTPUT_SAMPLES) -> dict[str, Tensor]:
    """The head's outputs ``N(x_j)`` (float64) on at most ``max_samples`` evenly spaced training samples, with their
    indices."""
    indices = output_indices(len(x), max_samples)
    with torch.no_grad():
        values = forward_with_slopes(net.to(x.device), x[indices.to(x.device)])[0]
    return {"indices": indices, "values": values.detach().to("cpu", torch.float64)}


def module_device(module: nn.Module) -> torch.device:
    """Where ``module``'s parameters (else buffers) live; the CPU for a module without either."""
    tensor = next(iter(module.parameters()), None)
    if tensor is None:
        tensor = next(iter(module.buffers()), None)
    return torch.device("cpu") if tensor is None else tensor.device


def module_outputs(module: nn.Module, x: Tensor, max_samples: int = OUTPUT_SAMPLES,
                   batch_size: int = 1024) -> dict[str, Tensor]:
    """``module``'s outputs (its own forward in eval mode, on its device, as float64 on the CPU) on at most
    ``max_samples`` evenly spaced samples of ``x`` (as :func:`module_inputs` gives them), with their indices:
    ``values`` is ``(n,)`` for one output (``(n,)`` or ``(n, 1)`` logits), ``(n, K)`` for ``K``. The module's mode is
    restored afterwards."""
    indices = output_indices(len(x), max_samples)
    with eval_mode(module), torch.no_grad():
        parts = [module(module_inputs(module, x[indices[i:i + batch_size].to(x.device)]))
                 for i in range(0, len(indices), batch_size)]
    values = torch.cat(parts).detach().to("cpu", torch.float64) if parts else torch.zeros(0, dtype=torch.float64)
    values = values.reshape(len(indices), -1)
    return {"indices": indices, "values": values[:, 0] if values.shape[1] == 1 else values}


def module_inputs(module: nn.Module, x: Tensor) -> Tensor:
    """``x`` as the module takes it: on its device and, when floating, in the floating dtype of its parameters (what
    a precision plugin such as ``"64-true"`` or ``"bf16-true"`` feeds it in training; exact for a wider dtype)."""
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
    return x.to(module_device(module), dtype if dtype is not None and x.is_floating_point() else x.dtype)
