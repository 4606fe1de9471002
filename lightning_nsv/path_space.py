"""Path space of Leaky-ReLU-family networks (DESIGN.md §1): the names of :mod:`lightning_nsv.kernel`, where they live.

Kept for existing imports: the formulas are in :mod:`lightning_nsv.kernel.formulas`, the network in
:mod:`~lightning_nsv.kernel.network`, the column provider in :mod:`~lightning_nsv.kernel.columns`, the input-Gram cache
in :mod:`~lightning_nsv.kernel.gram_cache`, the input chunks in :mod:`~lightning_nsv.kernel.inputs` and the path signs
in :mod:`~lightning_nsv.kernel.path_signs`. Patch a constant in the module that uses it, not here.
"""
from lightning_nsv.kernel.columns import INPUT_COPY_BYTES, PathKernelColumns
from lightning_nsv.kernel.formulas import (
    _combine,
    _forward,
    _kernel_block,
    forward_with_slopes,
    output_gram,
    path_kernel,
    path_kernel_diagonal,
    path_norm_squared,
    slopes,
    unique_patterns,
)
from lightning_nsv.kernel.gram_cache import (
    COMPACT_ROWS,
    RECOMPUTE_HITS_BELOW,
    InputGramCache,
    gather_rows,
    whole_block,
)
from lightning_nsv.kernel.inputs import (
    INPUT_CHUNK_BYTES,
    ZERO_FEATURES_SHARE,
    _input_gram_rows,
    _InputChunks,
    analysis_inputs,
    as_tensor_on,
    random_projection,
    used_features,
)
from lightning_nsv.kernel.network import PathNetwork
from lightning_nsv.kernel.path_signs import PathSigns, path_signs

__all__ = [
    "InputGramCache",
    "PathKernelColumns",
    "PathNetwork",
    "PathSigns",
    "forward_with_slopes",
    "path_kernel",
    "path_kernel_diagonal",
    "path_norm_squared",
    "path_signs",
    "slopes",
    "unique_patterns",
]
