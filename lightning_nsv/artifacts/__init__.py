"""The support-vector result files: what one analysis saves, how to load it and how to recompute it.

An analysis writes a pair ``<stem>.pt`` (everything, loadable with ``torch.load(weights_only=True)``) and
``<stem>.json`` (the numbers, for people and other tools, derived from the ``.pt``). Both carry the same ``id``.
The ``.pt`` records the SHA-256 of its own content, so a file changed after saving is refused; the pair is
replaced as one change (a failed or killed save leaves the previous pair loadable).

The ``.pt`` holds what reproduces the result: support indices, α, labels, kernel scale, solver settings and
tolerance, the state dict of the whole module (trunk included) with its class and init arguments, the data
module's class and init arguments with the training indices, the network's outputs on up to 4096 training
samples (which :func:`reproduce` compares), the package and torch versions, epoch and step, and the scope of the
analysis: ``"head"`` (a Linear/Leaky-ReLU head after a fixed embedding; every file before format 4) or ``"whole"``
(the whole traced module, with its scope line).

Example::

    >>> from lightning_nsv.artifacts import load_support_vectors, reproduce  # doctest: +SKIP
    >>> result = load_support_vectors("runs/digits_mlp/tensorboard/version_0/nsv/support_vectors_epoch28.pt")
    >>> again = reproduce(result)          # rebuilds module and data, refits: same support and α
    >>> (again.svm.support_ == result.support.numpy()).all()
    True

The modules: :mod:`~lightning_nsv.artifacts.format` (the payload, its checksum and checks),
:mod:`~lightning_nsv.artifacts.store` (the atomic pair: save, load, recovery), :mod:`~lightning_nsv.artifacts.rebuild`
(:func:`reproduce`, through the result's :class:`~lightning_nsv.scope.Scope`), :mod:`~lightning_nsv.artifacts.whole`
(whole-network results, ``scope == "whole"``: no path network, the module's own outputs). Each scope writes its part of
a file (:meth:`~lightning_nsv.scope.Scope.payload`). No Lightning import.
"""
from lightning_nsv.artifacts.format import (FORMAT_VERSION, OLDEST_READABLE, REQUIRED_KEYS, SCOPES,
                                            ArtifactCorruptError, ArtifactMismatchError, SupportVectorArtifact,
                                            class_path, content_sha256, plain)
from lightning_nsv.artifacts.rebuild import rebuild_module, reproduce
from lightning_nsv.artifacts.store import load_support_vectors, save_support_vectors
from lightning_nsv.scope.outputs import OUTPUT_SAMPLES, module_outputs, network_outputs
from lightning_nsv.scope.whole import whole_network_payload

__all__ = ["ArtifactCorruptError", "ArtifactMismatchError", "SupportVectorArtifact", "content_sha256",
           "load_support_vectors", "module_outputs", "network_outputs", "reproduce", "save_support_vectors",
           "whole_network_payload"]
