"""The factored pair network as a mode of the graph interpreter (lightning_nsv.kernel.graph.run, mode "factored"):
every block of pairs it gives equals the plain pair network's to 1e-12 of the largest entry, on the networks of
tests/kernel/test_pair_network.py's CASES and on the rest of the vocabulary (pieces, where gates, maxouts, a summing
head after a channel-wise map, the pair input read before any conv)."""
from __future__ import annotations

import pytest
import torch

from lightning_nsv.models.residual import SmallResNet
from tests.kernel.test_pair_factored import _InputFirst, _ScaledChannels, both
from tests.kernel.test_pair_network import CASES, inputs, randomise_bn
from tests.kernel.test_vocabulary_gates import Maxout, scaled
from tests.kernel.test_vocabulary_gates_networks import Mixed

MORE = {
    "input_first": (lambda: _InputFirst(), (2, 8, 8)),
    "scaled_channels": (lambda: _ScaledChannels(), (1, 8, 8)),
    "mixed_vocabulary": (lambda: scaled(Mixed(1), factor=2.0), (1, 6, 6)),
    "mixed_vocabulary_3_outputs": (lambda: scaled(Mixed(3), factor=2.0), (1, 6, 6)),
    "maxout_values": (lambda: scaled(Maxout("view_max_values")), (1, 6, 6)),
    "small_resnet": (lambda: randomise_bn(SmallResNet(2, 1, 3, (1, 1), beta=0.1)).eval(), (2, 8, 8)),
}


def _case(name):
    make, shape = CASES[name] if name in CASES else MORE[name]
    return make(), inputs(shape, n=6)


@pytest.mark.parametrize("name", sorted(CASES) + sorted(MORE))
def test_factored_mode_gives_the_plain_pair_network(name):
    torch.manual_seed(0)
    module, x = _case(name)
    fast, plain = both(module, x, fast=False)
    assert fast.engine == "factored torch"
    rows, cols = torch.tensor([4, 0, 2, 5]), torch.tensor([1, 3, 5])
    factored = fast.pairs(rows, cols, outer=True)
    reference = plain.pairs(rows.repeat_interleave(len(cols)), cols.repeat(len(rows)))
    scale = reference.abs().max().clamp(min=1e-300)
    torch.testing.assert_close(factored / scale, reference / scale, rtol=0, atol=1e-12)


def test_the_factored_network_is_a_mode_of_the_interpreter(monkeypatch):
    """graph.run(…, "factored") with the pair input as terms gives exactly the blocks PairNetworkColumns gives; each
    node asks its own rule's ``factored`` (a BatchNorm's, once per BatchNorm), every other rule the default."""
    from lightning_nsv.kernel import rules as R
    from lightning_nsv.kernel.factored import Terms, plain
    from lightning_nsv.kernel.graph import run
    from lightning_nsv.kernel.pair_network import _PairContext

    torch.manual_seed(0)
    module, x = _case("small_resnet")
    fast, _ = both(module, x, fast=False)
    rows, cols = torch.tensor([4, 0, 2, 5]), torch.tensor([1, 3, 5])
    asked = []
    for cls in (R.BatchNorm, R.Rule):
        original = cls.factored
        monkeypatch.setattr(cls, "factored", lambda self, *a, _o=original, _c=cls: asked.append(_c) or _o(self, *a))
    ctx = _PairContext(fast.graph, fast.gates, rows, cols, outer=True)
    out = plain(run(fast.graph, Terms.input(ctx, fast.x), "factored", ctx))
    assert torch.equal(out[:, 0] if out.dim() == 2 else out, fast.pairs(rows, cols, outer=True))
    norms = sum(isinstance(rule, R.BatchNorm) for rule in fast.graph.rules.values())
    assert norms and asked.count(R.BatchNorm) == 2 * norms and R.Rule in asked  # two runs: here and in fast.pairs
