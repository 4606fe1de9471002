"""Network support vectors and loss-valley diagnostics for Leaky-ReLU networks, as Lightning callbacks.

The functional core imports no Lightning: :mod:`~lightning_nsv.kernel` (path kernels of Leaky-ReLU chains and of
any traced piecewise-linear module), :mod:`~lightning_nsv.solver` (max-margin problems in path space),
:mod:`~lightning_nsv.analysis` (network support vectors, Ψ and the loss-valley certificates), :mod:`~lightning_nsv.
artifacts` (result files) and :mod:`~lightning_nsv.compare` (support sets of several result files);
:mod:`~lightning_nsv.plotting` draws their figures. :mod:`~lightning_nsv.callbacks`, :mod:`~lightning_nsv.models`
and :mod:`~lightning_nsv.datamodules` are the Lightning shell, :mod:`~lightning_nsv.cli` its command line.
Import from these subpackages; each exports its public names.
"""
__version__ = "0.1.0"
