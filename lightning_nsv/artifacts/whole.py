"""Result files of whole-network analyses (``scope == "whole"``).

A whole-network result holds no path network: the module's state dict holds every weight, and its outputs (the
module's own forward in eval mode, as float64) on up to :data:`~lightning_nsv.scope.outputs.OUTPUT_SAMPLES` evenly
spaced training samples show whether a rebuilt module computes what the analysed one did. Its summary line ("whole
network: 5 maps, 4 gate layers, …") is saved too. The keys come from :func:`whole_network_payload` (the whole scope's
part of the file, :class:`~lightning_nsv.scope.WholeScope`); :func:`~lightning_nsv.artifacts.reproduce` recomputes
it through the same scope.
"""
from lightning_nsv.scope.outputs import module_outputs
from lightning_nsv.scope.whole import whole_network_payload

__all__ = ["module_outputs", "whole_network_payload"]
