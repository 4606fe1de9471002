"""The head as the analysed part: the Linear/Leaky-ReLU head that :func:`~lightning_nsv.extract.find_path_part` finds,
after a trunk treated as a fixed embedding (paper 000's CNN + FC protocol)."""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from lightning_nsv.analysis.binary import network_support_vectors, uses_dense_kernel
from lightning_nsv.analysis.multiclass import multiclass_support_vectors
from lightning_nsv.analysis.warm_start import serve_kernel_columns
from lightning_nsv.extract import PathPart
from lightning_nsv.kernel.formulas import forward_with_slopes
from lightning_nsv.kernel.network import PathNetwork
from lightning_nsv.kernel.sharded import ColumnSharing
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.scope.base import AnalysisOptions, Scope
from lightning_nsv.scope.outputs import module_inputs, network_outputs

__all__ = ["HeadScope", "TF32_RTOL", "head_scope_line", "reduced_float32_matmuls"]

#: Relative tolerance of the head check when float32 products on CUDA may run in TF32 (a 10-bit mantissa, machine
#: epsilon 2**-10): far above their rounding, far below what a sigmoid or an extra layer changes.
TF32_RTOL = 2e-2


def reduced_float32_matmuls(device: torch.device, backends: Any = torch.backends) -> bool:
    """Whether float32 products on ``device`` may run in TF32. Read through the precision API of torch >= 2.9 where
    there is one (reading the legacy flag after a setting through the new API raises), else the legacy flag."""
    if device.type != "cuda":
        return False
    matmul = backends.cuda.matmul
    try:
        precision = getattr(matmul, "fp32_precision", None)
        if precision is None:  # torch < 2.9
            return bool(matmul.allow_tf32)
        if precision == "none":  # inherits the global setting
            precision = backends.fp32_precision
    except RuntimeError:
        return True  # a state torch will not report: allow for it
    return precision not in ("ieee", "none")  # "none" at both levels: the default, IEEE float32


def _kinds(module: nn.Module) -> str:
    counts = Counter(type(m).__name__ for m in module.modules()
                     if not list(m.children()) and not isinstance(m, (nn.Identity, nn.Dropout)))
    return ", ".join(f"{n} {kind}" if n > 1 else kind for kind, n in counts.items())


def parameter_free(module: nn.Module | None) -> bool:
    return module is None or not any(True for _ in module.parameters())


def head_scope_line(part: PathPart, embedding: str | None = None) -> str:
    """``head only: …; trunk … is a fixed embedding (paper 000's CNN + FC)``, from the head ``part``."""
    sizes = "→".join(str(n) for n in [part.linears[0].in_features, *(lin.out_features for lin in part.linears)])
    slopes = sorted({(b, g) for b, g in zip(part.betas, part.gammas)})
    gates = "; ".join(f"β = {b:g}, γ = {g:g}" for b, g in slopes)
    count = f"{len(part.linears)} Linear layer{'s' * (len(part.linears) > 1)}"
    line = f"head only: {count} of {part.name} ({sizes}{', gates ' + gates if gates else ''})"
    if parameter_free(part.embedding):
        return f"{line}; no trunk, so the head is the whole network"
    named = f"`{embedding}` " if embedding else ""
    return f"{line}; trunk {named}({_kinds(part.embedding)}) is a fixed embedding (paper 000's CNN + FC)"


def _values(row: Tensor) -> str:
    return ", ".join(f"{v:.6g}" for v in row[:4].tolist()) + (", ..." if len(row) > 4 else "")


class HeadScope(Scope):
    """The head ``part`` (its trunk a fixed embedding), said by ``line`` (default :func:`head_scope_line`).

    ``path_module``/``embedding``: the names that chose it (saved, so that ``reproduce`` finds it again);
    ``whole_traces``: whether the whole module would be accepted (a mismatch suggests it only then)."""

    kind = "head"

    def __init__(self, part: PathPart, *, path_module: str | None = None, embedding: str | None = None,
                 line: str | None = None, whole_traces: bool = False) -> None:
        self.part, self.path_module, self.embedding, self.whole_traces = part, path_module, embedding, whole_traces
        self._line = line or head_scope_line(part, embedding)

    @property
    def name(self) -> str:
        return self.part.name

    @property
    def num_outputs(self) -> int:
        return self.part.num_outputs

    @property
    def subject(self) -> str:
        return f"the head {self.name}"

    @property
    def line(self) -> str:
        return self._line

    @property
    def label(self) -> str:
        return "whole network" if parameter_free(self.part.embedding) else "head only (trunk fixed)"

    def embed(self, x: Tensor) -> Tensor:
        return self.part.embed(x)

    def freeze(self) -> PathNetwork:
        return self.part.path_network()

    def outputs(self, frozen: PathNetwork, x: Tensor, keep_gates: bool = False) -> tuple[Tensor, None]:
        return forward_with_slopes(frozen, x)[0], None

    def output_mismatch(self, module: nn.Module, x: Tensor, where: str, indices: Sequence[int] | None = None,
                        scale: float = 0.0, warn: Callable[[str], None] | None = None) -> str | None:
        """Why the module's output on ``x`` is not the head's, or ``None`` when it is. ``scale``: the size of the
        head's outputs over the training set (samples near the boundary have small outputs but the rounding of the
        sums that make them); ``warn`` hears of a module computing in a precision below float32."""
        module_name = type(module).__name__
        with eval_mode(module), torch.no_grad():
            x = module_inputs(module, x)
            output = module(x)
            if not isinstance(output, Tensor):
                return (f"{module_name}.forward returns a {type(output).__name__}, not one tensor of logits, so the "
                        f"analysis cannot check that its path part {self.name} gives the module's output; "
                        "return the logits alone from forward")
            output = output.reshape(len(x), -1)
            head = forward_with_slopes(self.freeze(), self.embed(x).cpu())[0].reshape(len(x), -1)
        if output.shape[1] != head.shape[1]:
            return (f"the output of {module_name} has {output.shape[1]} values per sample, but its path part "
                    f"{self.name} has {head.shape[1]}; the module must return the head's output unchanged")
        precision = output.dtype if output.is_floating_point() else torch.float32
        if precision not in (torch.float32, torch.float64) and warn is not None:
            warn(f"NetworkSupportVectors: {module_name} computes in {precision}; the analysis evaluates its head in "
                 "float64 from these rounded weights, so its own outputs may differ in sign on samples within "
                 "rounding of the decision boundary. Train with precision='32-true' for an exact match.")
        rtol = max(1e-4, 64 * torch.finfo(precision).eps)
        if precision == torch.float32 and reduced_float32_matmuls(output.device):
            rtol = TF32_RTOL  # set_float32_matmul_precision("high"/"medium"): float32 products in TF32
        output = output.cpu().double()
        scale = max(scale, float(head.abs().max()) if len(head) else 1.0)
        far = ~torch.isclose(output, head, rtol=rtol, atol=max(1e-5, rtol * scale)).all(1)
        if not bool(far.any()):
            return None
        row = int(far.nonzero()[0, 0])
        sample = f"training sample {indices[row]}" if indices is not None else f"row {row} of {where}"
        whole = (" or analyse the whole network (`scope='whole'`), whose function is the module's own" if
                 self.whole_traces else "")
        return (
            f"NetworkSupportVectors: the output of {module_name} is not the output of its path part {self.name} "
            f"({_values(output[row])} against {_values(head[row])} on {sample}, checked on {where}), so an analysis of "
            "that head would not describe the module (it could report zero training error the module does not have). "
            "Choices: make `forward` return the path part's output unchanged (no sigmoid, no extra layers, no "
            f"parameter added or multiplied outside it); name the parts with `path_module=`/`embedding=`{';' * bool(whole)}"
            f"{whole}."
        )

    def fitting_text(self, options: AnalysisOptions) -> str:
        if uses_dense_kernel(options.kernel, options.intercept):
            return "dense path kernel"
        return "path kernel columns of candidate support vectors"

    def analyse(self, frozen: PathNetwork, x: Tensor, y: Tensor, x_val: Tensor | None, y_val: Tensor | None,
                options: AnalysisOptions, sharing: ColumnSharing | None = None, *, initial: Sequence[int] | None = None,
                cache: Any = None, gates: Any = None, say: Callable[[str], None] | None = None,
                progress: bool = False) -> Any:
        if frozen.num_outputs == 1:
            return network_support_vectors(
                frozen, x, y, x_val, y_val, intercept=options.intercept, C=options.C, delta=options.delta,
                kernel=options.kernel, max_dense_bytes=options.max_dense_bytes, initial=initial, sharing=sharing,
                solver=options.solver, cache=cache)
        return multiclass_support_vectors(frozen, x, y, x_val, y_val, method=options.multiclass, delta=options.delta,
                                          solver=options.solver)  # on the CPU: warns for "torch"

    def serve(self, frozen: PathNetwork, x: Tensor) -> int:
        return serve_kernel_columns(frozen, x)

    def shares_columns(self, options: AnalysisOptions) -> bool:
        return self.num_outputs == 1 and not uses_dense_kernel(options.kernel, options.intercept)

    def payload(self, analysis: Any, frozen: PathNetwork, x: Tensor, y: Tensor,
                options: AnalysisOptions) -> dict[str, Any]:
        from lightning_nsv.analysis.binary import signed_labels
        from lightning_nsv.solver.multiclass import class_labels

        svm = analysis.svm
        labels = signed_labels(y) if self.num_outputs == 1 else torch.from_numpy(class_labels(y, self.num_outputs))
        return {
            "scope": self.kind,
            "scope_summary": self.line,
            "support": torch.from_numpy(svm.support_),
            "alpha": torch.from_numpy(svm.alpha_),
            "intercept": getattr(svm, "intercept_", 0.0),
            "labels": labels,
            "num_outputs": frozen.num_outputs,
            "network": {"weights": list(frozen.weights),
                        "biases": None if frozen.biases is None else list(frozen.biases),
                        "betas": list(frozen.betas), "gammas": list(frozen.gammas)},
            "path_part": self.name,
            "path_module": self.path_module,
            "embedding": self.embedding,
            "solver": {"intercept": options.intercept, "C": options.C, "method": svm.method,
                       "backend": getattr(analysis, "solver_backend", "numpy"),  # multi-class: the CPU
                       "multiclass": options.multiclass, "kernel": options.kernel,
                       "max_dense_bytes": options.max_dense_bytes,
                       "kernel_scale": getattr(svm, "kernel_scale", None),
                       "C_effective": getattr(svm, "C_effective", None),
                       "kkt_residual": svm.kkt_residual, "iterations": getattr(svm, "iterations", 0)},
            "outputs": network_outputs(frozen, x),  # reproduce() compares them
        }

    @staticmethod
    def payload_problems(payload: Mapping[str, Any]) -> list[str]:
        """A head result holds its path network."""
        network = payload["network"]
        if not (isinstance(network, Mapping) and isinstance(network.get("weights"), (list, tuple))
                and network["weights"] and all(isinstance(w, Tensor) for w in network["weights"])):
            return ["'network' must hold 'weights', a list of tensors"]
        return []

    def saved_outputs(self, frozen: PathNetwork, x: Tensor, batch_size: int = 1024) -> Tensor:
        return network_outputs(frozen, x, max_samples=len(x))["values"]

    def patterns(self, frozen: PathNetwork, x: Tensor, gates: Any = None) -> Tensor | None:
        slopes = forward_with_slopes(frozen.to(x.device), x)[1]
        if not slopes:
            return None
        bits = torch.cat([s == g for s, g in zip(slopes, frozen.gammas)], dim=1).cpu().numpy()
        return torch.from_numpy(np.packbits(bits, axis=1))

    def figures(self, frozen: PathNetwork, x: Tensor, y: Tensor, analysis: Any) -> list[tuple[str, Any]]:
        """Decision boundaries of network and SVM for 2-D inputs; the signed weights of small networks (binary)."""
        if frozen.num_outputs != 1:
            return []
        from lightning_nsv.plotting import data_extent, decision_grid, plot_decision_boundaries, plot_path_weights

        figures = []
        if x.shape[1] == 2:
            svm, sv = analysis.svm, analysis.svm.support_
            grid = decision_grid(frozen, x[sv], y[sv], svm.alpha_[sv], svm.intercept_, extent=data_extent(x),
                                 resolution=150)
            figures.append(("nsv/decision_boundaries", plot_decision_boundaries(grid, x, y, sv)[0]))
        if sum(w.numel() for w in frozen.weights) <= 400:
            figures.append(("nsv/path_weights", plot_path_weights(frozen, analysis.signs)[0]))
        return figures
