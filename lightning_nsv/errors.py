"""Errors shared by the analyses."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from torch import Tensor


class NonFiniteError(ValueError):
    """Values of an analysis (weights, inputs, outputs, Ψ) hold NaN or inf."""


class NoDataError(ValueError):
    """Tensors of an analysis are on the ``meta`` device: shapes without values."""


MODULE_FIX = "give it its values first, e.g. `module.to_empty(device='cpu')` then `module.load_state_dict(state_dict)`"


def check_has_data(named: Iterable[tuple[str, Tensor]], owner: str, fix: str = MODULE_FIX) -> None:
    """Refuse tensors on the ``meta`` device (``owner`` names whose they are, ``fix`` what to do), before anything
    reads their values."""
    meta = [name for name, t in named if t.is_meta]
    if meta:
        shown = ", ".join(meta[:3]) + (f", … ({len(meta)} in all)" if len(meta) > 3 else "")
        raise NoDataError(f"{owner} is on the meta device ({shown}: shapes without values, e.g. built under "
                          f"`torch.device('meta')` and never loaded), so there is nothing to analyse; {fix}")
