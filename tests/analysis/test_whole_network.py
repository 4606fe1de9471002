"""The support-vector analysis of a whole traced network (issue 32) against the head-only analyses, a dense solve and
explicitly enumerated paths."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from lightning_nsv.analysis import centred_gram, multiclass_support_vectors, network_support_vectors
from lightning_nsv.analysis.whole_network import (
    NOT_COMPUTED,
    WholeNetworkAnalysis,
    WholeNetworkMulticlassAnalysis,
    memory_estimate,
    whole_network_support_vectors,
)
from lightning_nsv.errors import NonFiniteError
from lightning_nsv.extract import find_path_part
from lightning_nsv.kernel import NotPiecewiseLinearError, PairNetworkColumns, compute_gates, trace
from lightning_nsv.kernel.rules import Linear
from lightning_nsv.models.layers import eval_mode, mlp_sequential
from lightning_nsv.solver import NotSeparableError, max_margin, multiclass_max_margin
from tests.pair_reference import output_phi, shared_paths
from tests.kernel.test_pair_network import Residual, TinyResNet, randomise_bn

ALPHA_TOL = 1e-10
METRIC_TOL = 1e-10


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny float64 convolutions: one thread is far faster than two on a shared host."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def relative(a, b) -> float:
    a, b = torch.as_tensor(np.asarray(a), dtype=torch.float64), torch.as_tensor(np.asarray(b), dtype=torch.float64)
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-300))


def close(a: float, b: float, tol: float = METRIC_TOL) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(b))


# ----------------------------------------------------------------------------------------------------- data, nets


def digits(classes, n_train: int, n_val: int = 0):
    """8×8 digits of the given classes, (n, 1, 8, 8) in [0, 1], labels 0..len(classes)−1 (their order)."""
    from sklearn.datasets import load_digits
    data = load_digits()
    keep = np.isin(data.target, classes)
    x = torch.tensor(data.images[keep], dtype=torch.float32)[:, None] / 16
    y = torch.tensor([classes.index(t) for t in data.target[keep]])
    return x[:n_train], y[:n_train], x[n_train:n_train + n_val], y[n_train:n_train + n_val]


def tiny_cnn(outputs: int = 1, channels: int = 2) -> nn.Sequential:
    """conv → ReLU → max pool → conv → ReLU → flatten → Linear on 8×8 inputs."""
    return nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(channels * 16, outputs))


def train_to_zero_error(module: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 400) -> nn.Module:
    """Adam on the cross-entropy until every training sample is classified with a margin (at most ``steps``)."""
    opt = torch.optim.Adam(module.parameters(), lr=1e-2)
    for step in range(steps):
        opt.zero_grad()
        out = module(x)
        if out.shape[1] == 1:
            loss = nn.functional.binary_cross_entropy_with_logits(out[:, 0], y.float())
            errors = int(((out[:, 0] > 0).long() != y).sum())
        else:
            loss = nn.functional.cross_entropy(out, y)
            errors = int((out.argmax(1) != y).sum())
        if errors == 0 and step >= 50:
            break
        loss.backward()
        opt.step()
    return module


@pytest.fixture(scope="module")
def binary_cnn():
    torch.manual_seed(0)
    x, y, xv, yv = digits([3, 8], 120, 40)
    return train_to_zero_error(tiny_cnn(), x, y), x, y, xv, yv


@pytest.fixture(scope="module")
def three_class_cnn():
    torch.manual_seed(1)
    x, y, xv, yv = digits([0, 3, 8], 120, 40)
    return train_to_zero_error(tiny_cnn(outputs=3), x, y), x, y, xv, yv


def own_labels(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Labels the module classifies without error: sign of one output (0/1), else argmax."""
    with torch.no_grad():
        out = module(x).reshape(len(x), -1)
    return (out[:, 0] > 0).long() if out.shape[1] == 1 else out.argmax(1)


def two_classes(module: nn.Module, x: torch.Tensor) -> nn.Module:
    """``module`` with the bias of its last Linear shifted by minus the mean of each output over ``x``, so that its
    own labels on ``x`` hold more than one class where they held one (a random network often gives every sample one
    class, which the analysis refuses)."""
    with eval_mode(module):
        if len(torch.unique(own_labels(module, x))) > 1:
            return module
        last = [m for m in module.modules() if isinstance(m, nn.Linear)][-1]
        with torch.no_grad():
            last.bias -= module(x).reshape(len(x), -1).mean(0)
        assert len(torch.unique(own_labels(module, x))) > 1
    return module


def separated(module: nn.Module, n: int, features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random inputs on which the module has no zero output nor tie, and the labels it gives them."""
    x = torch.randn(4 * n, features)
    with torch.no_grad():
        out = module(x)
    top2 = out.topk(2, dim=1).values if out.shape[1] > 1 else None
    keep = out[:, 0].abs() > 1e-6 if top2 is None else top2[:, 0] - top2[:, 1] > 1e-6
    x = x[keep][:n]
    assert len(x) == n
    return x, own_labels(module, x)


# ---------------------------------------------------------------------------------------- MLP: the head analyses


@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
def test_mlp_binary_equals_network_support_vectors(beta, bias):
    torch.manual_seed(3 + bias + int(10 * beta))
    module = mlp_sequential(10, [8, 6], 1, beta=beta, bias=bias)
    (x, y), (xv, yv) = separated(module, 150, 10), separated(module, 60, 10)
    yv[:5] = 1 - yv[:5]  # some validation errors
    ours = whole_network_support_vectors(module, x, y, xv, yv)
    theirs = network_support_vectors(find_path_part(module).path_network(), x, y, xv, yv, kernel="columns")
    assert isinstance(ours, WholeNetworkAnalysis)
    np.testing.assert_array_equal(ours.svm.support_, theirs.svm.support_)
    assert relative(ours.svm.alpha_, theirs.svm.alpha_) < ALPHA_TOL
    for name in ("cosine", "margin_ratio", "network_margin", "wbar_norm", "bound"):
        assert close(getattr(ours, name), getattr(theirs, name)), name
    ours_metrics, theirs_metrics = ours.to_metrics(), theirs.to_metrics()
    for key, value in theirs_metrics.items():
        if key.startswith("path_"):
            assert key not in ours_metrics  # signs are not computed: no fake values
        else:
            assert close(ours_metrics[key], value), key
    assert ours.n_hidden == theirs.n_hidden == 14
    assert ours.signs is NOT_COMPUTED and not ours.signs
    for a, b in zip(ours.val_predictions, theirs.val_predictions):
        assert torch.equal(a, b)


@pytest.mark.parametrize("beta, bias", [(0.0, True), (0.1, False)])
def test_mlp_three_classes_equals_multiclass_support_vectors(beta, bias):
    torch.manual_seed(7 + bias)
    module = two_classes(mlp_sequential(10, [8, 6], 3, beta=beta, bias=bias), torch.randn(200, 10, generator=torch.Generator().manual_seed(0)))
    (x, y), xv, yv = separated(module, 120, 10), torch.randn(50, 10), torch.randint(0, 3, (50,))
    ours = whole_network_support_vectors(module, x, y, xv, yv)
    theirs = multiclass_support_vectors(find_path_part(module).path_network(), x, y, xv, yv)
    assert isinstance(ours, WholeNetworkMulticlassAnalysis)
    np.testing.assert_array_equal(ours.svm.support_, theirs.svm.support_)
    assert relative(ours.svm.alpha_, theirs.svm.alpha_) < ALPHA_TOL
    assert relative(ours.gram, theirs.gram) < METRIC_TOL
    for name in ("cosine", "margin_ratio", "network_margin", "wc_norm", "bound"):
        assert close(getattr(ours, name), getattr(theirs, name)), name
    ours_metrics = ours.to_metrics()
    for key, value in theirs.to_metrics().items():
        assert close(ours_metrics[key], value), key
    assert ours.side_bits == theirs.side_bits == 14 + 2
    for a, b in zip(ours.val_predictions, theirs.val_predictions):
        assert torch.equal(a, b)


@pytest.mark.parametrize("outputs", [1, 3])
def test_warm_start_and_torch_solver_give_the_same_solution(outputs):
    torch.manual_seed(11)
    module = mlp_sequential(10, [8], outputs)
    x, y = separated(module, 100, 10)
    cold = whole_network_support_vectors(module, x, y)
    others = [whole_network_support_vectors(module, x, y, initial=cold.svm.support_[::2]),
              whole_network_support_vectors(module, x, y, initial=torch.from_numpy(cold.svm.support_))]
    if outputs == 1:
        others.append(whole_network_support_vectors(module, x, y, solver="torch"))
        assert others[-1].solver_backend == "torch (cpu)" and cold.solver_backend == "numpy"
    for other in others:
        np.testing.assert_array_equal(other.svm.support_, cold.svm.support_)
        assert relative(other.svm.alpha_, cold.svm.alpha_) < ALPHA_TOL


# ---------------------------------------------------------------------------------------------- tiny CNN: exact


def test_cnn_binary_equals_dense_solve_and_enumerated_kernel(binary_cnn):
    module, x, y, xv, yv = binary_cnn
    analysis = whole_network_support_vectors(module, x, y, xv, yv)
    assert analysis.svm.n_margin_violations == 0 and analysis.svm.kkt_residual < 1e-8
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    dense = PairNetworkColumns(graph, x, gates).columns_tensor(range(len(x)))
    assert relative(dense, dense.T) < 1e-14
    exact = max_margin(dense, torch.where(y > 0, 1.0, -1.0))
    np.testing.assert_array_equal(analysis.svm.support_, exact.support_)
    assert relative(analysis.svm.alpha_, exact.alpha_) < ALPHA_TOL
    few = [0, 7, 19, 42, 101]
    phi, _ = output_phi(graph, x[few], 0)
    assert relative(dense[few][:, few], phi @ phi.T) < 1e-12

    # validation against the kernel of the concatenated sets, formed directly
    both = torch.cat([x, xv])
    full = PairNetworkColumns(graph, both, compute_gates(graph, both)).columns_tensor(range(len(x)))[len(x):]
    signs = torch.where(y > 0, 1.0, -1.0).double()
    decision = full @ (torch.from_numpy(analysis.svm.alpha_) * signs)
    svm_pred = torch.where(decision >= 0, 1.0, -1.0)
    with torch.no_grad():
        net_pred = torch.where(module(xv)[:, 0].double() >= 0, 1.0, -1.0)
    target = torch.where(yv > 0, 1.0, -1.0)
    assert torch.equal(analysis.val_predictions[1], svm_pred.double())
    assert torch.equal(analysis.val_predictions[0], net_pred.double())
    assert analysis.val_agreement == pytest.approx(float((svm_pred == net_pred).double().mean()), abs=1e-7)
    assert analysis.val_errors_network == int((net_pred != target).sum())
    assert analysis.val_errors_svm == int((svm_pred != target).sum())
    assert analysis.val_errors_both == int(((net_pred != target) & (svm_pred != target)).sum())
    assert 0 < analysis.unique_patterns_val <= len(xv)


def materialised(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``phi`` (n, P) and ``wbar`` (P, K) of every path (the path space shared by the outputs of a last Linear)."""
    with eval_mode(module):
        graph = trace(module, x)
    if graph.num_outputs == 1:
        phi, wbar = output_phi(graph, x, 0)
        return phi, wbar[:, None]
    return shared_paths(graph, x, next(name for name, rule in graph.rules.items() if isinstance(rule, Linear)))


NETWORKS = {  # name: (module maker, outputs)
    "conv_maxpool_conv": (lambda: tiny_cnn(), 1),
    # BatchNorm statistics of seed 4: with seed 0's these networks give every sample one output, and one class
    "residual_bn_dropout_constants": (lambda: randomise_bn(Residual(), seed=4).train(), 1),
    "tiny_resnet_3_classes": (lambda: randomise_bn(TinyResNet(), seed=4), 3),
}


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_norm_cosine_and_margins_against_materialised_paths(name):
    """``||wbar||²`` (or the output Gram), cosine(wbar, v) and the margins from phi and wbar of every path (DESIGN.md
    §2c), on networks with fixed constants (in phi: weight 1 in wbar), BatchNorm, dropout and a module in training
    mode."""
    torch.manual_seed(5)
    make, outputs = NETWORKS[name]
    x = digits([3, 8], 30)[0]
    module = two_classes(make(), x)
    with eval_mode(module):
        y = own_labels(module, x)
    analysis = whole_network_support_vectors(module, x, y)
    phi, wbar = materialised(module, x)
    with torch.no_grad(), eval_mode(module):
        out = copy.deepcopy(module).double()(x.double()).reshape(len(x), outputs)
    assert relative(phi @ wbar, out) < 1e-12
    if outputs == 1:
        signs = torch.where(y > 0, 1.0, -1.0).double()
        w = wbar[:, 0]
        v = phi.T @ (torch.from_numpy(analysis.svm.alpha_) * signs)
        assert close(analysis.wbar_norm ** 2, float(w @ w), 1e-12)
        network_margin = float((signs * (phi @ w)).min()) / float(w.norm())
        assert float((signs * (phi @ v)).min()) == pytest.approx(1.0, abs=1e-9)  # v is the max-margin direction
    else:
        w = wbar - wbar.mean(1, keepdim=True)  # Wc
        v = phi.T @ torch.from_numpy(analysis.svm.beta_)
        assert relative(wbar.T @ wbar, analysis.gram) < 1e-12
        assert close(analysis.wc_norm, float(w.norm()), 1e-12)
        scores = phi @ wbar
        margins = scores.gather(1, y[:, None]) - scores
        margins[torch.arange(len(y)), y] = math.inf
        network_margin = float(margins.min()) / float(w.norm())
    assert close(analysis.cosine, float((w * v).sum() / (w.norm() * v.norm())), 1e-10)
    assert close(analysis.network_margin, network_margin, 1e-10)
    assert close(analysis.margin_ratio, network_margin * float(v.norm()), 1e-10)
    assert close(analysis.svm.norm_v_sq, float(v @ v) if v.dim() == 1 else float((v * v).sum()), 1e-10)


def test_cnn_three_classes_equals_dense_solve_and_materialised_paths(three_class_cnn):
    module, x, y, xv, yv = three_class_cnn
    analysis = whole_network_support_vectors(module, x, y, xv, yv)
    assert analysis.num_classes == 3 and analysis.svm.kkt_residual < 1e-8
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    dense = PairNetworkColumns(graph, x, gates).columns_tensor(range(len(x)))
    exact = multiclass_max_margin(dense, y, 3, structured=False)
    np.testing.assert_array_equal(analysis.svm.support_, exact.support_)
    assert relative(analysis.svm.alpha_, exact.alpha_) < ALPHA_TOL

    # cosine(Wc, V), ||Wc|| and the network margin against phi and wbar_k of every path on a few samples: V is a
    # combination of the support's phi, so the support suffices
    last = next(name for name, rule in graph.rules.items() if isinstance(rule, Linear))
    sv = analysis.svm.support_
    phi, wbar = shared_paths(graph, x[sv], last)
    assert relative(phi @ phi.T, dense[sv][:, sv]) < 1e-12
    wc = wbar - wbar.mean(1, keepdim=True)
    v = phi.T @ torch.from_numpy(analysis.svm.beta_[sv])
    assert relative(wbar.T @ wbar, analysis.gram) < 1e-12
    assert relative(wc.T @ wc, centred_gram(analysis.gram)) < 1e-12
    assert close(analysis.wc_norm, float(wc.norm()), 1e-12)
    assert close(analysis.cosine, float((wc * v).sum() / (wc.norm() * v.norm())), 1e-10)
    assert close(analysis.margin_ratio * analysis.svm.margin, analysis.network_margin, 1e-12)
    with torch.no_grad():
        out = module(x).double()
    margins = out.gather(1, y[:, None]) - out
    margins[torch.arange(len(y)), y] = math.inf
    assert close(analysis.network_margin, float(margins.min()) / float(wc.norm()), 1e-6)  # float32 module outputs

    # validation: argmax of f = K(x_val, x) β against argmax N
    both = torch.cat([x, xv])
    full = PairNetworkColumns(graph, both, compute_gates(graph, both)).columns_tensor(range(len(x)))[len(x):]
    svm_pred = (full @ torch.from_numpy(analysis.svm.beta_)).argmax(1)
    net_pred = compute_gates(graph, xv).output.argmax(1)
    assert torch.equal(analysis.val_predictions[1], svm_pred)
    assert torch.equal(analysis.val_predictions[0], net_pred)
    assert analysis.val_agreement == pytest.approx(float((svm_pred == net_pred).double().mean()), abs=1e-7)
    assert analysis.val_errors_network == int((net_pred != yv).sum())
    assert analysis.val_errors_svm == int((svm_pred != yv).sum())
    assert analysis.side_bits == analysis.n_hidden + 2 == 2 * 64 + 2 * 16 + 2 * 16 + 2


# ----------------------------------------------------------------------------------------- report, scope, module


def test_scope_in_report_and_metrics(binary_cnn):
    module, x, y, *_ = binary_cnn
    analysis = whole_network_support_vectors(module, x, y)
    assert analysis.scope == "whole network: 3 maps, 2 gate layers, 1 max-pool, 192 gates"
    assert analysis.report().splitlines()[0] == f"path kernel of the {analysis.scope}"
    assert "192 bits per support vector" in analysis.report()
    metrics = analysis.to_metrics()
    assert (metrics["scope_maps"], metrics["scope_gate_layers"], metrics["scope_max_pools"],
            metrics["scope_gates"]) == (3.0, 2.0, 1.0, 192.0)
    assert analysis.n_hidden == 192 and not any(k.startswith("path_") for k in metrics)
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    head = whole_network_support_vectors(module, x, y, scope_name="layers after the trunk")
    assert head.report().startswith("path kernel of the layers after the trunk: 3 maps")


def test_module_unchanged():
    """Mode (a BatchNorm in training mode is read in eval), dtype, parameters and buffers are left as they were."""
    torch.manual_seed(2)
    module = nn.Sequential(nn.Conv2d(1, 2, 3, bias=False), nn.BatchNorm2d(2), nn.ReLU(), nn.MaxPool2d(2),
                           nn.Flatten(), nn.Linear(18, 1))
    module[1].running_mean.uniform_(-0.1, 0.1)
    x = digits([3, 8], 60)[0]
    with torch.no_grad():
        module.eval()
        y = own_labels(module, x)
    module.train()
    state = copy.deepcopy(module.state_dict())
    whole_network_support_vectors(module, x, y)
    assert module.training and all(m.training for m in module.modules())
    assert all(p.dtype == torch.float32 and p.requires_grad for p in module.parameters())
    after = module.state_dict()
    assert all(torch.equal(state[k], after[k]) for k in state)


# -------------------------------------------------------------------------------------------------- refusals


def test_refuses_training_error_naming_count_and_first_indices(binary_cnn):
    module, x, y, *_ = binary_cnn
    wrong = y.clone()
    wrong[[4, 9]] = 1 - wrong[[4, 9]]
    with pytest.raises(NotSeparableError, match=r"misclassifies 2 of 120 training samples \(first: 4, 9;"):
        whole_network_support_vectors(module, x, wrong)


def test_refuses_three_class_training_error(three_class_cnn):
    module, x, y, *_ = three_class_cnn
    wrong = y.clone()
    wrong[[3, 50, 51]] = (wrong[[3, 50, 51]] + 1) % 3
    with pytest.raises(NotSeparableError, match=r"misclassifies 3 of 120 training samples \(first: 3, 50, 51;.*"
                                                r"N_y\(x\) − N_k\(x\) > 0"):
        whole_network_support_vectors(module, x, wrong)


def test_refuses_duplicates_with_different_labels():
    module = mlp_sequential(4, [3], 3)
    x = torch.randn(10, 4)
    x[7] = x[2]
    y = own_labels(module, x)
    y[7] = (y[2] + 1) % 3
    with pytest.raises(NotSeparableError, match="samples 2 and 7 have the same input and different labels"):
        whole_network_support_vectors(module, x, y)


def test_refuses_zero_output_as_error():
    module = nn.Sequential(nn.Flatten(), nn.Linear(4, 3, bias=False), nn.ReLU(), nn.Linear(3, 1, bias=False))
    x, y = separated(module, 6, 4)
    x[3] = 0.0
    with pytest.raises(NotSeparableError, match="1 of them on the boundary"):
        whole_network_support_vectors(module, x, y)


def test_refuses_gelu_inside():
    module = nn.Sequential(nn.Conv2d(1, 2, 3), nn.GELU(), nn.Flatten(), nn.Linear(72, 1))
    x = digits([3, 8], 20)[0]
    with pytest.raises(NotPiecewiseLinearError, match="GELU"):
        whole_network_support_vectors(module, x, torch.ones(20))


def test_refuses_non_finite():
    module = mlp_sequential(4, [3], 1)
    x = torch.randn(8, 4)
    y = own_labels(module, x)
    bad = x.clone()
    bad[5, 1] = float("nan")
    with pytest.raises(NonFiniteError, match="training inputs are not finite at sample 5"):
        whole_network_support_vectors(module, bad, y)
    with pytest.raises(NonFiniteError, match="validation inputs"):
        whole_network_support_vectors(module, x, y, bad)
    broken = copy.deepcopy(module)
    broken[3].weight.data[0, 1] = float("inf")
    with pytest.raises(NonFiniteError, match=r"parameter 3\.weight holds inf"):
        whole_network_support_vectors(broken, x, y)
    huge = copy.deepcopy(module).double()
    for p in huge.parameters():
        p.data.fill_(1e200)
    with pytest.raises(NonFiniteError):
        whole_network_support_vectors(huge, x.double(), torch.ones(8))


def test_refuses_over_memory_budget_with_the_numbers(binary_cnn):
    module, x, y, xv, _ = binary_cnn
    graph = trace(module, x)
    parts = memory_estimate(graph, len(x), len(xv))
    assert parts["gates"] == (len(x) + len(xv)) * (2 * 64 + 2 * 16 + 4 * 2 * 16 + 8)
    assert parts["inputs"] == 8 * (len(x) + len(xv)) * 64
    from lightning_nsv.kernel.fused import pair_program
    from lightning_nsv.kernel.pair_factors import factor_bytes
    assert parts["factors"] == (len(x) + len(xv)) * factor_bytes(pair_program(graph)) > 0
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")
    with pytest.raises(ValueError, match=r"needs at least .* MiB before its solver starts \(inputs .* MiB, gates .* "
                                         r"MiB, .*\), above memory_bytes="):
        whole_network_support_vectors(module, x, y, xv, memory_bytes=parts["total"] - 1)
    columns = 8 * len(x)
    with pytest.raises(ValueError, match=r"kernel columns of \d+ samples \(.* MiB; .* MiB with the inputs and gates\), "
                                         r"above memory_bytes="):
        whole_network_support_vectors(module, x, y, xv, memory_bytes=parts["total"] + 3 * columns)
    fits = whole_network_support_vectors(module, x, y, xv, memory_bytes=parts["total"] + len(x) * columns)
    assert fits.n_support > 3


def test_three_class_solver_columns_count_against_the_budget():
    torch.manual_seed(4)
    module = tiny_cnn(outputs=3)
    x = digits([0, 3, 8], 60)[0]
    y = own_labels(module, x)
    total = memory_estimate(trace(module, x), len(x))["total"]
    with pytest.raises(ValueError, match=r"kernel columns of \d+ samples"):
        whole_network_support_vectors(module, x, y, memory_bytes=total + 2 * 8 * len(x))
    assert whole_network_support_vectors(module, x, y, memory_bytes=total + len(x) * 8 * len(x)).n_support > 2


def test_refuses_bad_options(binary_cnn):
    module, x, y, *_ = binary_cnn
    with pytest.raises(ValueError, match="num_classes=3"):
        whole_network_support_vectors(module, x, y, num_classes=3)
    with pytest.raises(ValueError, match="binary labels"):
        whole_network_support_vectors(module, x, y + 2)
    with pytest.raises(ValueError, match="solver"):
        whole_network_support_vectors(module, x, y, solver="cuda")
    with pytest.raises(ValueError, match=r"`initial` must hold sample indices in \[0, 120\)"):
        whole_network_support_vectors(module, x, y, initial=[0, len(x)])
    with pytest.raises(ValueError, match="class labels must be integers in \\[0, 3\\)"):
        whole_network_support_vectors(tiny_cnn(outputs=3), x, y + 2)
    with pytest.raises(ValueError, match="num_classes=2, but the network has 3 outputs"):
        whole_network_support_vectors(tiny_cnn(outputs=3), x, y, num_classes=2)
    with pytest.raises(ValueError, match="binary labels"):
        whole_network_support_vectors(module, x[:30], y[:30], x[30:40], y[30:40] + 0.5)
    with pytest.raises(ValueError, match="delta"):
        whole_network_support_vectors(module, x, y, delta=1.5)
    assert whole_network_support_vectors(module, x[:30], y[:30], num_classes=2).m == 30


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_module_gives_the_cpu_answer(binary_cnn, three_class_cnn):
    for module, x, y, xv, yv in (binary_cnn, three_class_cnn):
        cpu = whole_network_support_vectors(module, x, y, xv, yv)
        gpu_module = copy.deepcopy(module).cuda()
        gpu = whole_network_support_vectors(gpu_module, x.cuda(), y.cuda(), xv.cuda(), yv.cuda())
        np.testing.assert_array_equal(gpu.svm.support_, cpu.svm.support_)
        assert relative(gpu.svm.alpha_, cpu.svm.alpha_) < 1e-9
        assert close(gpu.cosine, cpu.cosine, 1e-9) and gpu.val_agreement == cpu.val_agreement
