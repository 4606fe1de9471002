"""What an analysis looks at, as a type (no Lightning import).

A :class:`Scope` embeds the inputs, freezes the analysed function at the current weights, analyses
``(x, y, x_val, y_val, options, sharing)``, says what it is and writes its part of the result file. Three
implementations: :class:`HeadScope`, the Linear/Leaky-ReLU head after a fixed embedding (paper 000's CNN + FC
protocol), :class:`WholeScope`, the whole module traced into the pair network of DESIGN.md §2c, and :class:`CutScope`,
everything from the input of a named submodule on (what comes before it a fixed float64 embedding). The callback and
:func:`~lightning_nsv.artifacts.reproduce` choose one once (:func:`choose_scope`, :func:`scope_of_result`) and call
its methods; nothing else asks which it is.
"""
from lightning_nsv.scope.base import AnalysisOptions, Frozen, Scope
from lightning_nsv.scope.choice import (EXAMPLE_SAMPLES, RESULT_SCOPES, SCOPES, NoAnalysableScopeError, ScopeDecision,
                                        ScopeRequest, check_request, check_scope, choose_scope, find_head,
                                        scope_of_result)
from lightning_nsv.scope.cut import CUT_PREFIX, CutScope, cut_name
from lightning_nsv.scope.head import HeadScope, head_scope_line
from lightning_nsv.scope.outputs import (OUTPUT_SAMPLES, module_device, module_inputs, module_outputs, network_outputs,
                                         output_indices)
from lightning_nsv.scope.whole import TracedNetwork, WholeScope, whole_network_payload

__all__ = ["AnalysisOptions", "check_request", "check_scope", "choose_scope", "cut_name", "CUT_PREFIX", "CutScope",
           "EXAMPLE_SAMPLES", "find_head", "Frozen", "head_scope_line", "HeadScope", "module_device",
           "module_inputs", "module_outputs", "network_outputs", "NoAnalysableScopeError", "output_indices",
           "OUTPUT_SAMPLES", "RESULT_SCOPES", "Scope", "scope_of_result", "ScopeDecision", "ScopeRequest", "SCOPES",
           "TracedNetwork", "whole_network_payload", "WholeScope"]
