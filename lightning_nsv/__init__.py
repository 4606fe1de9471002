"""Network support vectors and loss-valley diagnostics for Leaky-ReLU networks, as Lightning callbacks.

The functional core (``path_space``, ``solver`` — re-exported by ``max_margin`` —, ``support_vectors``,
``multiclass``, ``psi``, ``valley``, ``artifacts``) imports no Lightning;
``callbacks``, ``models`` and ``datamodules`` are the Lightning shell.
"""
__version__ = "0.1.0"
