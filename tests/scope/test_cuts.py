"""A cut as the path-space input (issue 44): the cut at the input is the whole-network analysis and the cut at the
head's first Linear the head analysis, bit for bit; every intermediate cut of tiny conv/BN/residual networks equals
enumerated paths on the float64 embedded inputs; cuts that a skip connection crosses are refused by name; the
callback's `scope="from:NAME"` saves a result that reproduces."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

from lightning_nsv.analysis import whole_network_cost, whole_network_support_vectors
from lightning_nsv.artifacts import load_support_vectors, reproduce, save_support_vectors
from lightning_nsv.callbacks import NetworkSupportVectors
from lightning_nsv.kernel import PairNetworkColumns, compute_gates, trace
from lightning_nsv.kernel.cut import cut_network, valid_cuts
from lightning_nsv.solver import max_margin
from lightning_nsv.solver import multiclass_max_margin
from lightning_nsv.models.layers import eval_mode
from lightning_nsv.scope import AnalysisOptions, CutScope, HeadScope, ScopeRequest, WholeScope, choose_scope
from tests.pair_reference import output_phi
from tests.callbacks.test_callback_scope import CNN, _fit
from lightning_nsv.datamodules import DigitsDataModule
from tests.kernel.test_pair_network import Residual, TinyResNet, randomise_bn
from tests.analysis.test_whole_network import (digits, one_thread, own_labels, relative, tiny_cnn,  # noqa: F401
                                               train_to_zero_error, two_classes)

TOL = 1e-12




def analyse(module, request, x, y, xv, yv):
    scope = choose_scope(module, x, ScopeRequest(request)).scope
    with eval_mode(module), torch.no_grad():
        embedded, embedded_val = scope.embed(x), scope.embed(xv)
    return scope, scope.analyse(scope.freeze(), embedded, y, embedded_val, yv, AnalysisOptions())


def assert_identical(a, b):
    np.testing.assert_array_equal(a.svm.support_, b.svm.support_)
    np.testing.assert_array_equal(a.svm.alpha_, b.svm.alpha_)


@pytest.mark.parametrize("classes", [[3, 8], [0, 3, 8]])
def test_the_cut_at_the_input_is_the_whole_network_bit_for_bit(classes):
    torch.manual_seed(len(classes))
    x, y, xv, yv = digits(classes, 80, 30)
    module = train_to_zero_error(tiny_cnn(1 if len(classes) == 2 else 3), x, y).eval()
    whole_scope, whole = analyse(module, "whole", x, y, xv, yv)
    cut_scope, cut = analyse(module, "from:input", x, y, xv, yv)
    assert isinstance(whole_scope, WholeScope) and isinstance(cut_scope, CutScope) and cut_scope.kind == "cut"
    assert_identical(cut, whole)
    assert cut.val_agreement == whole.val_agreement and cut.bound == whole.bound
    assert cut.scope == "layers from `input`: 3 maps, 2 gate layers, 1 max-pool, 192 gates"
    with_start = whole_network_support_vectors(module, x, y, xv, yv, start="input", say=None, progress=False)
    assert_identical(with_start, whole)


@pytest.mark.parametrize("outputs", [1, 3])
def test_the_cut_at_the_heads_first_linear_is_the_head_analysis_bit_for_bit(outputs):
    torch.manual_seed(outputs)
    classes = [3, 8] if outputs == 1 else [0, 3, 8]
    x, y, xv, yv = digits(classes, 100, 30)
    net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32, 6),
                        nn.LeakyReLU(0.1), nn.Linear(6, outputs))
    net = train_to_zero_error(net, x, y).double().eval()
    x, xv = x.double(), xv.double()
    head_scope, head = analyse(net, "head", x, y, xv, yv)
    assert isinstance(head_scope, HeadScope)
    for name in ("4", "3"):  # the first Linear, and the Flatten before it
        scope, cut = analyse(net, f"from:{name}", x, y, xv, yv)
        assert isinstance(scope.inner, HeadScope) and scope.label == f"from `{name}`"
        assert_identical(cut, head)
        assert cut.val_agreement == head.val_agreement and cut.unique_patterns_train == head.unique_patterns_train
    starts = whole_network_support_vectors(net, x, y, xv, yv, start="4", say=None, progress=False)
    np.testing.assert_array_equal(starts.svm.support_, head.svm.support_)
    assert relative(starts.svm.alpha_, head.svm.alpha_) < 1e-10  # the whole-network code path on the same kernel


def hooked_input(module: nn.Module, name: str, x: torch.Tensor) -> torch.Tensor:
    """The input of submodule ``name`` in a float64 copy of ``module`` (eval mode): the reference embedding."""
    exact = copy.deepcopy(module).double().eval()
    seen = []
    handle = exact.get_submodule(name).register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    with torch.no_grad():
        exact(x.double())
    handle.remove()
    return seen[0]


NETWORKS = {  # maker, input shape
    "conv_maxpool_conv": (lambda: tiny_cnn(), (1, 8, 8)),
    "residual_bn_constants": (lambda: randomise_bn(Residual(), seed=4), (1, 8, 8)),
    "tiny_resnet_3_classes": (lambda: randomise_bn(TinyResNet(), seed=4), (1, 8, 8)),
}


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_every_intermediate_cut_equals_enumerated_paths_on_the_embedded_inputs(name):
    maker, shape = NETWORKS[name]
    torch.manual_seed(5)
    x = torch.randn(24, *shape, generator=torch.Generator().manual_seed(2))
    module = two_classes(maker().eval(), x)
    y = own_labels(module, x)
    cuts = valid_cuts(module, every=True)
    assert cuts[0] == "input" and len(cuts) >= 3
    for cut in cuts[1:]:
        part = cut_network(module, cut)
        scope = choose_scope(module, x, ScopeRequest(f"from:{cut}")).scope
        h = scope.embedding(x)
        assert h.dtype == torch.float64 and torch.equal(h, hooked_input(module, cut, x))
        graph = trace(part.after.eval(), h)
        kernel = PairNetworkColumns(graph, h, compute_gates(graph, h)).columns_tensor(range(len(x)))
        with torch.no_grad():
            reference_out = copy.deepcopy(module).double().eval()(x.double()).reshape(len(x), -1)
        for k in range(graph.num_outputs):
            phi, wbar = output_phi(graph, h, k)
            assert relative(phi @ wbar, reference_out[:, k]) < TOL, (cut, k)
            assert relative(kernel, phi @ phi.T) < TOL, cut
        analysis = whole_network_support_vectors(module, x, y, start=cut, say=None, progress=False)
        reference = phi @ phi.T  # the enumerated kernel (every output has the same)
        exact = max_margin(reference, torch.where(y > 0, 1.0, -1.0).double()) if graph.num_outputs == 1 else \
            multiclass_max_margin(reference, y, graph.num_outputs, structured=False)
        np.testing.assert_array_equal(analysis.svm.support_, exact.support_)
        assert relative(analysis.svm.alpha_, exact.alpha_) < 1e-9, cut
        with eval_mode(module), torch.no_grad():
            embedded = scope.embed(x)
        again = scope.analyse(scope.freeze(), embedded, y, None, None, AnalysisOptions())
        np.testing.assert_array_equal(again.svm.support_, analysis.svm.support_)
        assert relative(again.svm.alpha_, analysis.svm.alpha_) < 1e-10


def test_a_cut_inside_a_skip_connection_is_refused_naming_it():
    module = TinyResNet().eval()
    with pytest.raises(ValueError, match=r"cannot be cut at `conv2`.*`down_1` \(the output of `down.1`\), which "
                                         r"does not pass through it, is read by `add`"):
        cut_network(module, "conv2")
    with pytest.raises(ValueError, match=r"`relu` of TinyResNet reads 3 values from before it"):
        cut_network(module, "relu")
    with pytest.raises(ValueError, match=r"no submodule 'layer9' to cut at"):
        choose_scope(module, torch.randn(2, 1, 8, 8), ScopeRequest("from:layer9"))
    assert valid_cuts(module) == ["input", "conv1", "fc"]
    assert valid_cuts(module, every=True) == ["input", "bn0", "conv1", "pool", "fc"]


def test_the_scope_argument_takes_a_cut_and_refuses_head_options():
    NetworkSupportVectors(scope="from:net.3")
    with pytest.raises(ValueError, match="names no module"):
        NetworkSupportVectors(scope="from:")
    with pytest.raises(ValueError, match="options of scope='head'"):
        NetworkSupportVectors(scope="from:net.3", intercept=True)


@pytest.mark.parametrize("cut, inner", [("trunk.0.res", WholeScope), ("head", HeadScope)])
def test_the_callback_analyses_from_a_cut_and_its_file_reproduces(tmp_path, cut, inner):
    torch.set_num_threads(1)
    model, callback = CNN(split=True), NetworkSupportVectors(scope=f"from:{cut}", save_dir=str(tmp_path / "nsv"))
    _fit(tmp_path, model, DigitsDataModule(m=40, batch_size=10, seed=0), callback)
    analysis = callback.analysis
    assert analysis is not None and isinstance(callback._scope.inner, inner)
    saved = load_support_vectors(tmp_path / "nsv" / f"support_vectors_epoch{callback.zero_error_epoch}.pt")
    assert saved.scope == "cut" and saved.path_module == cut and saved.path_part == f"CNN from `{cut}`"
    assert saved.support.tolist() == analysis.svm.support_.tolist()
    again = reproduce(saved, module=CNN(split=True))
    assert again.svm.support_.tolist() == analysis.svm.support_.tolist()
    np.testing.assert_allclose(again.svm.alpha_, analysis.svm.alpha_, rtol=1e-8, atol=1e-12)
    payload = torch.load(saved.path, weights_only=True)
    for key in ("id", "sha256", "format_version", "versions", "report"):
        payload.pop(key)
    with pytest.raises(ValueError, match="a cut result must name its cut in 'path_module'"):
        save_support_vectors(tmp_path / "refused", "x", {**payload, "path_module": None})
    assert not (tmp_path / "refused").exists() or not list((tmp_path / "refused").iterdir())


def test_the_module_is_left_as_it_was_and_the_cost_of_a_cut_is_its_own():
    torch.manual_seed(0)
    module = randomise_bn(TinyResNet(), seed=4).train()
    x = torch.randn(16, 1, 8, 8)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    scope = choose_scope(module, x, ScopeRequest("from:conv1")).scope
    h = scope.embed(x)
    assert h.dtype == torch.float64 and module.training and all(p.dtype == torch.float32 for p in module.parameters())
    assert all(torch.equal(state[k], v) for k, v in module.state_dict().items())
    whole, cut = whole_network_cost(module, x, 200), whole_network_cost(module, x, 200, start="conv1")
    assert cut.m == whole.m == 200 and cut.pairs == whole.pairs  # the same pairs, of a smaller network
    assert scope.estimate_cost(x, 200, 0).engine == cut.engine


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_module_gives_the_cpu_answer_from_a_cut():
    torch.manual_seed(1)
    x, y, xv, yv = digits([3, 8], 80, 30)
    module = train_to_zero_error(tiny_cnn(), x, y).eval()
    cpu = whole_network_support_vectors(module, x, y, xv, yv, start="3", say=None, progress=False)
    gpu_module = copy.deepcopy(module).cuda()
    scope = choose_scope(gpu_module, x.cuda(), ScopeRequest("from:3")).scope
    with torch.no_grad():
        embedded, embedded_val = scope.embed(x.cuda()), scope.embed(xv.cuda())
    assert embedded.device.type == "cuda"
    gpu = scope.analyse(scope.freeze(), embedded, y.cuda(), embedded_val, yv.cuda(), AnalysisOptions())
    np.testing.assert_array_equal(gpu.svm.support_, cpu.svm.support_)
    assert relative(gpu.svm.alpha_, cpu.svm.alpha_) < 1e-9


@pytest.mark.parametrize("cut", ["trunk.0.res", "head"])
def test_three_classes_from_a_cut_in_the_callback_with_patterns_between_analyses(tmp_path, cut):
    from tests.callbacks.test_callback_scope import _digits
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    train, val = _digits([0, 1, 2], 60), _digits([0, 1, 2], 30, seed=1)
    callback = NetworkSupportVectors(scope=f"from:{cut}", stop_on_zero_error=False, every_n_epochs=3)
    _fit(tmp_path, CNN(classes=3, split=True), DataLoader(train, batch_size=20), callback, max_epochs=30,
         val=DataLoader(val, batch_size=30))
    analysis = callback.analysis
    assert analysis is not None and analysis.num_classes == 3 and analysis.svm.alpha_.shape == (60, 3)
    assert len(callback.history) >= 2 and 0 <= callback.history[-1]["patterns_changed"] <= 60
    assert callback._scope.label == f"from `{cut}`" and callback.metrics["val_agreement"] >= 0


def test_the_cut_at_the_input_of_an_mlp_is_the_auto_scope_bit_for_bit():
    """A Linear/Leaky-ReLU chain: 'auto' analyses it by the head's code path, and so does the cut at its input."""
    from lightning_nsv.models.layers import mlp_sequential

    torch.manual_seed(3)
    x = torch.randn(120, 10, dtype=torch.float64)
    module = two_classes(mlp_sequential(10, [8, 6], 1, beta=0.1, bias=True).double().eval(), x)
    y = own_labels(module, x)
    xv, yv = torch.randn(40, 10, dtype=torch.float64), torch.randint(0, 2, (40,))
    auto_scope, auto = analyse(module, "auto", x, y, xv, yv)
    cut_scope, cut = analyse(module, "from:input", x, y, xv, yv)
    assert isinstance(auto_scope, HeadScope) and isinstance(cut_scope.inner, HeadScope)
    assert_identical(cut, auto)
    assert cut.bound == auto.bound and cut.cosine == auto.cosine


def test_a_module_whose_forward_is_not_its_traced_graph_is_refused_at_a_cut():
    class Counting(nn.Module):
        """Each call scales its output by the number of calls so far: fx reads one call."""

        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc, self.calls = nn.Conv2d(1, 2, 3), nn.Linear(72, 1), 0

        def forward(self, x):
            self.calls += 1
            return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))[:, 0] * self.calls

    with pytest.raises(ValueError, match=r"the part after `fc` on the embedding before it does not give the module's "
                                         r"output"):
        choose_scope(Counting().eval(), torch.randn(4, 1, 8, 8), ScopeRequest("from:fc"))
