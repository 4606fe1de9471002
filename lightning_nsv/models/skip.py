"""Skip-to-output networks (Nguyen, Mukkamala & Hein, ICLR 2019) built from an ``nn.Sequential``."""
from __future__ import annotations

import copy
import math
from typing import Any, Iterator, Literal, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_nsv.compat import pl
from lightning_nsv.models.layers import Activation, LeakyReLUFamily, eval_mode, mlp_sequential
from lightning_nsv.models.metrics import StageMetrics, check_labels
from lightning_nsv.validate import check_choice

MODES = ("original", "skip_sgd", "skip_rand")
OPTIMIZERS = ("sgd", "adam", "lbfgs")
_ACTIVATIONS = {nn.ReLU: "relu", nn.LeakyReLU: "leaky_relu", nn.Sigmoid: "sigmoid", nn.Softplus: "softplus",
                nn.Tanh: "tanh"}


def activation_name(module: nn.Module) -> str | None:
    """Name of an activation module (``"sigmoid"``, ``"relu"``, ...), None for anything else."""
    if isinstance(module, LeakyReLUFamily):
        return {(0.0, 1.0): "relu", (1.0, 1.0): "linear", (-1.0, 1.0): "abs"}.get(
            (module.beta, module.gamma), "leaky_relu")
    return next((name for cls, name in _ACTIVATIONS.items() if isinstance(module, cls)), None)


def _flat_modules(module: nn.Module) -> list[nn.Module]:
    """The modules of a (nested) ``nn.Sequential`` in call order."""
    if isinstance(module, nn.Sequential):
        return [m for child in module for m in _flat_modules(child)]
    return [module]


def _unit_shape(shape: Sequence[int], where: str) -> tuple[int, int, int]:
    if not 1 <= len(shape) <= 3:
        raise ValueError(f"hidden layer {where} has per-sample shape {tuple(shape)}; units are (channel, h, w), "
                         "so its output must have 1 to 3 dimensions besides the batch")
    return tuple(shape) + (1,) * (3 - len(shape))


def _unit_table(pos: int, shape: tuple[int, int, int], flat: Tensor) -> Tensor:
    """Rows ``(layer, channel, h, w)`` of the units with flat indices ``flat`` in a layer of ``shape``."""
    _, h, w = shape
    return torch.stack([torch.full_like(flat, pos), flat // (h * w), flat // w % h, flat % w], dim=1)


def _input_batches(data: Any, batch_size: int) -> Iterator[Tensor]:
    if isinstance(data, Tensor):
        yield from data.split(batch_size)
        return
    for batch in data:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        if not isinstance(x, Tensor):
            raise TypeError(f"expected batches `x` or `(x, y, ...)` of tensors, got a batch of {type(batch).__name__}")
        yield x


def _rebuild_gathers(module: SkipNetwork, incompatible_keys: Any) -> None:
    module._build_gathers()


class SkipNetwork(pl.LightningModule):
    """A network whose last hidden layer and M' more hidden units feed the K outputs directly.

    Built from an ``nn.Sequential`` that ends with its ``nn.Linear`` output layer (nested Sequentials are
    flattened). Hidden layers are the outputs of activation modules (sigmoid, softplus, tanh, ReLU,
    Leaky-ReLU and the package's :class:`~lightning_nsv.models.layers.LeakyReLUFamily`) or the module
    positions given in ``hidden_layers``; the *last hidden layer* is the input of the output layer. In the
    skip modes ``num_skip_units`` units are drawn uniformly without replacement, with ``skip_seed``, from all
    other hidden layers; a convolutional unit is one ``(channel, h, w)`` entry of a feature map.

    Choice about the output layer (paper §2, ``G = Ψ V``): in the skip modes the output layer is *replaced*
    by one bias-free linear map ``V`` (M×K) from the M = (width of the last hidden layer) + ``num_skip_units``
    skip units to the outputs; the columns of Ψ are the last hidden layer first, then the drawn units in
    the order of :attr:`skip_units`. The original output layer's weights are dropped (its connections are
    the first rows of ``V``). In ``mode="original"`` the network is the given one: Ψ is the last hidden
    layer and the output layer, bias included, is ``V``.

    Modes: ``"original"`` (no skip units), ``"skip_sgd"`` (U and V trained) and ``"skip_rand"`` (U random and
    frozen, ``requires_grad=False`` and kept in eval mode, only V trained: a convex problem in V). Loss:
    multi-class cross-entropy. The drawn units are the buffer :attr:`skip_units` (saved in and restored
    from checkpoints). Units are gathered layer by layer with ``index_select`` on each flattened activation;
    the concatenation of all hidden activations is never built.

    Args:
        net: An ``nn.Sequential``, a module that holds one as ``.net`` (this package's MLP and CNN+FC), or a
            mapping of keyword arguments of :func:`~lightning_nsv.models.layers.mlp_sequential` (built
            under ``skip_seed``; saved with the hyperparameters, so :meth:`load_from_checkpoint` needs no ``net``).
        input_shape: Shape of one input; when None, inferred from ``net.input_shape``, a ConvFCNet's
            ``in_channels`` and ``image_size``, the mapping's ``in_features`` or a leading ``nn.Linear``.
        num_skip_units: Units drawn from the hidden layers below the last one (0 in ``"original"`` mode).
        mode: ``"original"`` (no skip units), ``"skip_sgd"`` (hidden layers and V trained) or ``"skip_rand"``
            (hidden layers random and frozen, only V trained).
        skip_seed: Seed of the unit draw, of the new output layer and of a network built from a mapping
            (not ``seed``, which data modules use: Lightning refuses two different values of one name).
        hidden_layers: Positions, in the flattened module list, of the lower hidden layers to draw from;
            None takes every activation module except the last one.
        optimizer: ``"sgd"`` (with ``momentum``), ``"adam"``, or ``"lbfgs"`` (20 iterations with a strong-Wolfe
            line search per step, no weight decay; meant for the convex ``"skip_rand"`` problem with one batch
            holding the whole training set, ``lr=1``).
        lr: Learning rate.
        momentum: SGD momentum.
        weight_decay: L2 penalty of the optimizer.

    The optimizer is set by ``optimizer``, ``lr``, ``momentum`` and ``weight_decay``, on the command line
    ``--model.optimizer adam --model.lr 0.01``; LightningCLI's own ``--optimizer``, when given, replaces
    :meth:`configure_optimizers` and these arguments are then ignored.

    Raises:
        ValueError: On an unknown mode or optimizer, a non-positive ``lr``, ``num_skip_units`` out of range,
            a ``net`` that does not end with an ``nn.Linear`` of K >= 2 outputs or has no hidden layer, or
            an input shape that cannot be inferred; in any batch, on labels that are not
            integers in ``0..K-1``.
        TypeError: If ``net`` is none of the accepted kinds.

    Logged metrics (epoch aggregates through torchmetrics, synced across ranks): ``train_loss`` and
    ``train_acc_running``, the mean cross-entropy and accuracy over the epoch's batches, each with the weights
    of its step (with ``"lbfgs"``: the first evaluation of each batch); ``val_loss``, ``val_acc``,
    ``test_loss``, ``test_acc``, exact for the weights at the end of the epoch.

    Example::

        >>> model = SkipNetwork.mlp(64, [32] * 6, 10, "sigmoid", num_skip_units=100, mode="skip_sgd")
        >>> model.num_units, model(torch.zeros(5, 1, 8, 8)).shape
        (132, torch.Size([5, 10]))
    """

    def __init__(
        self,
        net: nn.Module | Mapping[str, Any],
        input_shape: Sequence[int] | None = None,
        num_skip_units: int = 0,
        mode: Literal["original", "skip_sgd", "skip_rand"] = "skip_sgd",
        skip_seed: int = 0,
        hidden_layers: Sequence[int] | None = None,
        optimizer: Literal["sgd", "adam", "lbfgs"] = "sgd",
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        check_choice("mode", mode, MODES)
        check_choice("optimizer", optimizer, OPTIMIZERS)
        if not lr > 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"need lr > 0, momentum >= 0, weight_decay >= 0, got {lr}, {momentum}, {weight_decay}")
        if optimizer == "lbfgs" and weight_decay:
            raise ValueError(
                f"optimizer 'lbfgs' has no weight decay, got weight_decay={weight_decay}; use 'sgd' or 'adam'"
            )
        if num_skip_units < 0 or (mode == "original" and num_skip_units):
            raise ValueError(f"`num_skip_units` must be >= 0, and 0 in mode 'original' (no skip connections), got "
                             f"{num_skip_units} in mode {mode!r}; choose mode 'skip_sgd' or 'skip_rand' to add units")
        self.save_hyperparameters(ignore=["net"] if isinstance(net, nn.Module) else None)
        self.mode = mode
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(skip_seed)
            modules = self._modules_of(net)
            self.input_shape = self._infer_input_shape(net, modules, input_shape)
            *hidden, output = modules
            if not isinstance(output, nn.Linear) or output.out_features < 2:
                raise ValueError(f"the last module of `net` must be the nn.Linear output layer with K >= 2 outputs "
                                 f"(multi-class cross-entropy; use 2 outputs for a binary task), got {output}")
            if not hidden:
                raise ValueError("`net` has no hidden layer: it must be hidden modules followed by an nn.Linear")
            self.trunk = nn.Sequential(*hidden)
            self._shapes = self._hidden_shapes(hidden_layers)
            self.register_buffer("skip_units", self._draw_units(num_skip_units, skip_seed))
            self.head = output if mode == "original" else nn.Linear(self.num_units, output.out_features, bias=False)
        if mode == "skip_rand":
            self.trunk.requires_grad_(False)
        self._build_gathers()
        self.register_load_state_dict_post_hook(_rebuild_gathers)
        for stage in ("train", "val", "test"):  # train_metrics, val_metrics, test_metrics
            setattr(self, f"{stage}_metrics", StageMetrics(output.out_features))

    @classmethod
    def mlp(
        cls,
        in_features: int,
        widths: Sequence[int],
        num_classes: int,
        activation: Activation = "sigmoid",
        num_skip_units: int = 0,
        mode: str = "skip_sgd",
        skip_seed: int = 0,
        bias: bool = True,
        **kwargs: Any,
    ) -> SkipNetwork:
        """Skip network on a fully connected ``in_features - widths... - num_classes`` network.

        ``kwargs`` go to :class:`SkipNetwork` (``optimizer``, ``lr``, ...).
        """
        spec = dict(in_features=in_features, widths=list(widths), out_features=num_classes,
                    activation=activation, bias=bias)
        return cls(spec, num_skip_units=num_skip_units, mode=mode, skip_seed=skip_seed, **kwargs)

    # ------------------------------------------------------------------------------------ construction
    @staticmethod
    def _modules_of(net: Any) -> list[nn.Module]:
        if isinstance(net, Mapping):
            return _flat_modules(mlp_sequential(**net))
        seq = net if isinstance(net, nn.Sequential) else getattr(net, "net", None)
        if not isinstance(seq, nn.Sequential):
            raise TypeError(f"`net` must be an nn.Sequential, a module with an nn.Sequential `.net` or a mapping of "
                            f"mlp_sequential arguments, got {type(net).__name__}")
        return _flat_modules(seq)

    @staticmethod
    def _infer_input_shape(net: Any, modules: list[nn.Module], input_shape: Sequence[int] | None) -> tuple[int, ...]:
        if input_shape is not None:
            return tuple(int(s) for s in input_shape)
        if isinstance(net, Mapping):
            return (int(net["in_features"]),)
        if getattr(net, "input_shape", None) is not None:
            return tuple(int(s) for s in net.input_shape)
        hp = getattr(net, "hparams", {})
        if "in_channels" in hp and "image_size" in hp:  # this package's ConvFCNet
            size = hp["image_size"]
            return (int(hp["in_channels"]), *((size, size) if isinstance(size, int) else size))
        first = next((m for m in modules if any(True for _ in m.parameters())), None)
        if isinstance(first, nn.Linear):
            return (first.in_features,)
        raise ValueError(f"cannot infer the input shape of `net` (its first layer is {type(first).__name__}); "
                         "pass input_shape=(C, H, W) or (features,)")

    def _hidden_shapes(self, hidden_layers: Sequence[int] | None) -> dict[int, tuple[int, int, int]]:
        """Per-sample ``(C, H, W)`` of the trunk output (key ``len(trunk) - 1``) and of the lower hidden layers."""
        names = [activation_name(m) for m in self.trunk]
        acts = [i for i, name in enumerate(names) if name is not None]
        lower = list(acts[:-1] if hidden_layers is None else hidden_layers)
        last = len(self.trunk) - 1
        if any(not 0 <= i < last for i in lower):
            raise ValueError(f"`hidden_layers` must be positions in 0..{last - 1} (below the last hidden layer at "
                             f"{last}) of the flattened modules, got {list(hidden_layers or ())}")
        shapes, x = {}, torch.zeros(1, *self.input_shape)
        with torch.no_grad(), eval_mode(self.trunk):
            for i, module in enumerate(self.trunk):
                x = module(x)
                if i in lower or i == last:
                    shapes[i] = _unit_shape(x.shape[1:], f"{i} ({type(module).__name__})")
        self._activations = tuple(names[i] or type(self.trunk[i]).__name__.lower() for i in sorted({*lower, *acts}))
        return shapes

    def _draw_units(self, k: int, seed: int) -> Tensor:
        lower = sorted(self._shapes)[:-1]
        sizes = torch.tensor([math.prod(self._shapes[i]) for i in lower], dtype=torch.int64)
        if k > int(sizes.sum()):
            raise ValueError(f"`num_skip_units` must be at most the {int(sizes.sum())} units of the hidden layers "
                             f"below the last one ({dict(zip(lower, sizes.tolist()))} by position), got {k}")
        if k == 0:
            return torch.zeros(0, 4, dtype=torch.int64)
        chosen = torch.randperm(int(sizes.sum()), generator=torch.Generator().manual_seed(seed))[:k].sort().values
        offsets = sizes.cumsum(0) - sizes
        layer = torch.searchsorted(offsets, chosen, right=True) - 1
        return torch.cat([_unit_table(lower[j], self._shapes[lower[j]], chosen[layer == j] - offsets[j])
                          for j in range(len(lower))])

    def _build_gathers(self) -> None:
        """Per-layer flat indices (non-persistent buffers) from :attr:`skip_units`; rerun after loading."""
        self._gather_positions = []
        for pos in sorted(self._shapes)[:-1]:
            rows = self.skip_units[self.skip_units[:, 0] == pos]
            _, h, w = self._shapes[pos]
            self.register_buffer(f"gather_{pos}", (rows[:, 1] * h + rows[:, 2]) * w + rows[:, 3], persistent=False)
            if len(rows):
                self._gather_positions.append(pos)

    # ------------------------------------------------------------------------------------ properties
    @property
    def num_units(self) -> int:
        """M: width of the last hidden layer plus the drawn skip units."""
        return math.prod(self._shapes[len(self.trunk) - 1]) + len(self.skip_units)

    @property
    def num_classes(self) -> int:
        return self.head.out_features

    @property
    def activations(self) -> tuple[str, ...]:
        """Names of the hidden activations (for the checks of Assumption 3.1)."""
        return self._activations

    @property
    def unit_table(self) -> Tensor:
        """(M, 4) rows ``(layer, channel, h, w)`` of the columns of Ψ, in order (last hidden layer first)."""
        last = len(self.trunk) - 1
        shape = self._shapes[last]
        flat = torch.arange(math.prod(shape), device=self.skip_units.device)
        return torch.cat([_unit_table(last, shape, flat), self.skip_units])

    def output_weights(self) -> tuple[Tensor, Tensor | None]:
        """``(V, b)``: the M×K weights from the skip units to the outputs and the output bias (None if none)."""
        return self.head.weight.T, self.head.bias

    # ------------------------------------------------------------------------------------ forward and Ψ
    def _features(self, trunk: nn.Sequential, x: Tensor) -> Tensor:
        parts = []
        for i, module in enumerate(trunk):
            x = module(x)
            if i in self._gather_positions:
                parts.append(x.flatten(1).index_select(1, getattr(self, f"gather_{i}")))
        return torch.cat([x.flatten(1), *parts], dim=1)

    def features(self, x: Tensor) -> Tensor:
        """The skip units' values on a batch: the rows of Ψ, shape (B, M)."""
        return self._features(self.trunk, x)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))

    @torch.no_grad()
    def iter_psi(
        self, data: Any, columns: slice | None = None, batch_size: int = 1024, dtype: torch.dtype = torch.float64
    ) -> Iterator[Tensor]:
        """Row blocks of ``Ψ[:, columns]`` over ``data``, computed in ``dtype`` on a copy of the hidden layers
        in eval mode (the module itself is left untouched). Holds one batch at a time.

        Args:
            data: Inputs (a tensor, split into ``batch_size`` rows) or an iterable of batches ``x`` or
                ``(x, y, ...)``, e.g. a non-shuffled DataLoader.
            columns: Columns of Ψ to keep; all when None.
            batch_size: Rows per block when ``data`` is a tensor.
            dtype: Floating dtype of the computation and of the blocks.
        """
        device = self.skip_units.device
        trunk = copy.deepcopy(self.trunk).to(dtype).eval()
        for x in _input_batches(data, batch_size):
            yield self._features(trunk, x.to(device=device, dtype=dtype))[:, columns or slice(None)]

    def psi(self, data: Any, columns: slice | None = None, batch_size: int = 1024,
            dtype: torch.dtype = torch.float64) -> Tensor:
        """Ψ (N×M, float64 by default, no bias column) on ``data``; see :meth:`iter_psi`."""
        return torch.cat(list(self.iter_psi(data, columns, batch_size, dtype)))

    # ------------------------------------------------------------------------------------ training
    def train(self, mode: bool = True) -> SkipNetwork:
        super().train(mode)
        if self.mode == "skip_rand":  # frozen random features: no dropout, no batch-norm statistics updates
            self.trunk.train(False)
        return self

    def _step(self, batch: Any, batch_idx: int, stage: str) -> Tensor:
        x, y = batch[0], batch[1]
        metrics = getattr(self, f"{stage}_metrics")
        check_labels(y, self.num_classes, type(self).__name__, {"train": "training"}.get(stage, stage), batch_idx)
        if batch_idx == 0:
            metrics.new_epoch()
            # metric objects, logged once per epoch: computed and reset by Lightning at the epoch's end
            acc_key = "train_acc_running" if stage == "train" else f"{stage}_acc"
            self.log(f"{stage}_loss", metrics.loss, on_step=False, on_epoch=True, prog_bar=stage != "test")
            self.log(acc_key, metrics.accuracy, on_step=False, on_epoch=True, prog_bar=stage != "test")
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        metrics.record(batch_idx, loss, logits, y)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._step(batch, batch_idx, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, batch_idx, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, batch_idx, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        hp = self.hparams
        if hp.optimizer == "adam":
            return torch.optim.Adam(params, lr=hp.lr, weight_decay=hp.weight_decay)
        if hp.optimizer == "lbfgs":  # for the convex skip_rand problem, with full-batch loaders
            return torch.optim.LBFGS(params, lr=hp.lr, max_iter=20, history_size=50, line_search_fn="strong_wolfe")
        return torch.optim.SGD(params, lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
