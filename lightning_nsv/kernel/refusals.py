"""Refusals of the operation table (:mod:`lightning_nsv.kernel.table`): what an operation outside DESIGN.md §2c's
table is, why the path kernel cannot read it in that operation's own terms, and only the choices that apply."""
from __future__ import annotations

__all__ = ["NotPiecewiseLinearError", "TRUNK", "refuse", "why_not"]


class NotPiecewiseLinearError(ValueError):
    """The module holds an operation outside the piecewise-linear table of DESIGN.md §2c."""


TRUNK = ("move it into a trunk that is treated as a fixed embedding (`embedding=`, as in paper 000's CNN + FC, "
         "analysing the layers after it)")
REPLACE = "replace it by a piecewise-linear activation (nn.ReLU, nn.LeakyReLU)"
EVAL = "analyse the module in eval mode (lightning_nsv.models.layers.eval_mode)"
REWRITE = "write it with operations of the table (the README's table of operations)"
BUFFER = "compute it once as a buffer or a module of its own"


def refuse(where: str, why: str, *choices: str, linear: bool = False) -> NotPiecewiseLinearError:
    """The error for an operation at ``where``: headed "not piecewise linear" (``linear``: "linear, but not in the
    table yet"), ``why`` in its own terms, and ``choices`` (default: a trunk)."""
    head = "is linear but not in the operation table yet" if linear else \
        "is not piecewise linear in the sense of the path kernel (DESIGN.md §2c)"
    return NotPiecewiseLinearError(f"{where} {head}: {why}. Choices: {'; or '.join(choices or (TRUNK,))}.")


GATE_WHY = "the path kernel needs gates that are fixed once x is fixed; {}'s slope varies continuously with its input"
_SMOOTH = {"sigmoid", "tanh", "gelu", "silu", "softplus", "elu", "selu", "celu", "mish", "hardswish",
           "hardsigmoid", "logsigmoid", "softsign", "tanhshrink", "exp", "log", "sqrt", "rsqrt", "pow", "sin", "cos",
           "erf", "square"}
_NORMALISE = {"layer_norm", "group_norm", "instance_norm", "batch_norm", "normalize", "local_response_norm",
              "rms_norm", "layernorm", "groupnorm", "instancenorm1d", "instancenorm2d", "instancenorm3d",
              "localresponsenorm", "rmsnorm"}
_ATTENTION = {"softmax", "log_softmax", "softmin", "scaled_dot_product_attention", "multiheadattention",
              "logsoftmax", "transformer", "transformerencoderlayer", "transformerdecoderlayer", "transformerencoder"}
_OTHER_PL = {"hardshrink", "softshrink", "threshold", "rrelu"}


def why_not(name: str) -> tuple[str, tuple[str, ...]] | None:
    """``(why, choices)`` for an operation the table knows it cannot read, by name; else ``None``."""
    key = name.lower()
    if key in _SMOOTH:
        return GATE_WHY.format(name), (TRUNK, REPLACE)
    if key in _NORMALISE:
        return (f"{name} normalises by a statistic of the sample, a non-linear function of x",
                (TRUNK, "replace it by BatchNorm, analysed in eval mode with its running statistics"))
    if key in _ATTENTION:
        return f"{name} weighs its inputs by a softmax, a smooth function of x (no fixed gates)", (TRUNK,)
    if key in _OTHER_PL:
        return (f"{name} is piecewise linear, but its saturated pieces (constant outputs) or random slopes are not "
                "in the table yet (the Leaky-ReLU family, PReLU, Hardtanh, ReLU6 and clamp are)", (TRUNK, REPLACE))
    return None
