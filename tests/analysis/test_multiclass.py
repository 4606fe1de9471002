import itertools
import math

import numpy as np
import pytest
import scipy.linalg
import scipy.optimize
import torch

from lightning_nsv.analysis import (centred_gram, multiclass_decision, multiclass_support_vectors,
                                    network_support_vectors)
from lightning_nsv.errors import NonFiniteError
from lightning_nsv.kernel import PathNetwork, forward_with_slopes, path_kernel, path_signs
from lightning_nsv.kernel.formulas import output_gram, path_norm_squared
from lightning_nsv.solver import (NotSeparableError, max_margin, multiclass_max_margin, one_vs_rest_max_margin,
                                  pair_margins)
from tests.reference import materialise_phi, materialise_wbar


def random_net(widths, num_outputs, in_features=3, beta=0.1, bias=True, seed=0) -> PathNetwork:
    gen = torch.Generator().manual_seed(seed)
    sizes = [in_features, *widths, num_outputs]
    weights = [torch.randn(sizes[k + 1], sizes[k], generator=gen, dtype=torch.float64) for k in range(len(sizes) - 1)]
    biases = [torch.randn(s, generator=gen, dtype=torch.float64) for s in sizes[1:]] if bias else None
    return PathNetwork(tuple(weights), None if biases is None else tuple(biases), (beta,) * len(widths),
                       (1.0,) * len(widths))


def self_labelled(net: PathNetwork, n: int, seed: int):
    """Samples labelled by the network's own argmax (zero training error), less those with a tie."""
    x = torch.randn(n, net.in_features, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    outputs = forward_with_slopes(net, x)[0]
    top2 = outputs.topk(2, dim=1).values
    keep = top2[:, 0] > top2[:, 1]
    return x[keep], outputs[keep].argmax(1)


def single_output(net: PathNetwork, k: int) -> PathNetwork:
    """The binary network of output ``k`` alone (same phi)."""
    biases = None if net.biases is None else (*net.biases[:-1], net.biases[-1][k:k + 1])
    return PathNetwork((*net.weights[:-1], net.weights[-1][k:k + 1]), biases, net.betas, net.gammas)


def materialise_wbars(net: PathNetwork) -> torch.Tensor:
    """``(K, P)``: ``wbar_k`` path by path, in the coordinate order of ``materialise_phi``."""
    return torch.stack([materialise_wbar(single_output(net, k)) for k in range(net.num_outputs)])


def pair_gram_by_loops(kernel: np.ndarray, y: np.ndarray, num_classes: int):
    """``Q_pq = K_ij ([y_i=y_j] − [y_i=l] − [k=y_j] + [k=l])`` entry by entry, pairs sample-major."""
    pairs = [(i, k) for i in range(len(y)) for k in range(num_classes) if k != y[i]]
    q = np.array([[kernel[i, j] * (int(y[i] == y[j]) - int(y[i] == l) - int(k == y[j]) + int(k == l)) for j, l in pairs]
                  for i, k in pairs], dtype=np.float64)
    return pairs, q


def exhaustive_kkt(q: np.ndarray, tol: float = 1e-9):
    """The KKT point of ``min ½αᵀQα − 1ᵀα, α >= 0`` by trying every support set (Q positive definite)."""
    n = q.shape[0]
    for size in range(1, n + 1):
        for support in map(list, itertools.combinations(range(n), size)):
            a = np.linalg.solve(q[np.ix_(support, support)], np.ones(size))
            alpha = np.zeros(n)
            alpha[support] = a
            if np.all(a > 0) and np.all(q @ alpha >= 1 - tol):
                return alpha
    raise AssertionError("no KKT point")


def nnls_dual(q: np.ndarray) -> np.ndarray:
    """``min ½αᵀQα − 1ᵀα, α >= 0`` as non-negative least squares ``||Lᵀα − L⁻¹1||`` (``Q = LLᵀ``)."""
    chol = np.linalg.cholesky(q)
    return scipy.optimize.nnls(chol.T, scipy.linalg.solve_triangular(chol, np.ones(len(q)), lower=True),
                               maxiter=50 * len(q))[0]


def test_forward_and_single_output_functions():
    net = random_net((4, 3), num_outputs=3, seed=1)
    x = torch.randn(7, 3, dtype=torch.float64)
    outputs, slopes = forward_with_slopes(net, x)
    assert net.num_outputs == 3 and outputs.shape == (7, 3) and len(slopes) == 2
    for k in range(3):
        torch.testing.assert_close(outputs[:, k], forward_with_slopes(single_output(net, k), x)[0], rtol=1e-13,
                                   atol=1e-13)
    binary = single_output(net, 0)
    assert binary.num_outputs == 1 and forward_with_slopes(binary, x)[0].shape == (7,)
    with pytest.raises(ValueError, match="path_norm_squared needs 1 output unit, got 3"):
        path_norm_squared(net)
    with pytest.raises(ValueError, match="path_signs needs 1 output unit, got 3"):
        path_signs(net)
    with pytest.raises(ValueError, match="output layer must have at least 1 unit, got 0"):
        PathNetwork((torch.ones(2, 3), torch.ones(0, 2)), None, (0.0,), (1.0,))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.1, -1.0, 1.0])
def test_outputs_and_output_gram_against_materialised_paths(bias, beta):
    net = random_net((3, 2), num_outputs=3, beta=beta, bias=bias, seed=4)
    x = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    phi, wbars = materialise_phi(net, x), materialise_wbars(net)
    torch.testing.assert_close(phi @ wbars.T, forward_with_slopes(net, x)[0], rtol=1e-12, atol=1e-12)
    gram = output_gram(net)
    np.testing.assert_allclose(gram, (wbars @ wbars.T).numpy(), rtol=1e-12)
    centred = wbars - wbars.mean(0)
    np.testing.assert_allclose(centred_gram(gram), (centred @ centred.T).numpy(), rtol=1e-10, atol=1e-10)
    assert np.trace(centred_gram(gram)) == pytest.approx(
        np.trace(gram) - gram.sum() / 3, rel=1e-12)
    binary = single_output(net, 2)
    assert output_gram(binary)[0, 0] == pytest.approx(path_norm_squared(binary), rel=1e-13)


def test_output_gram_without_hidden_layers():
    w, b = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    np.testing.assert_allclose(output_gram(PathNetwork((w,), (b,), (), ())), (w @ w.T + torch.outer(b, b)).numpy())


@pytest.mark.parametrize("bias", [False, True])
def test_pair_problem_against_exhaustive_kkt_search(bias):
    net = random_net((3, 2), num_outputs=3, bias=bias, seed=2)
    x, y = self_labelled(net, 4, seed=3)  # 8 pairs: all 255 support sets are tried
    kernel = path_kernel(x, forward_with_slopes(net, x)[1], bias=bias).numpy()
    pairs, q = pair_gram_by_loops(kernel, y.numpy(), 3)
    expected = exhaustive_kkt(q)
    result = multiclass_max_margin(kernel, y, 3)
    got = np.array([result.alpha_[i, k] for i, k in pairs])
    np.testing.assert_allclose(got, expected, rtol=1e-8, atol=1e-12)
    assert result.norm_v_sq == pytest.approx(expected.sum(), rel=1e-9)
    assert result.norm_v_sq == pytest.approx(float(expected @ q @ expected), rel=1e-9)
    assert result.n_support_pairs == int((expected > 0).sum())
    np.testing.assert_array_equal(result.support_, sorted({pairs[p][0] for p in np.flatnonzero(expected > 0)}))
    np.testing.assert_allclose(result.beta_.sum(1), 0.0, atol=1e-12)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.1, -1.0])
def test_primal_solution_in_materialised_path_space(bias, beta):
    net = random_net((3, 2), num_outputs=4, beta=beta, bias=bias, seed=7)
    x, y = self_labelled(net, 50, seed=8)
    x_val, y_val = self_labelled(net, 30, seed=9)
    y_val[:4] = (y_val[:4] + 1) % 4
    analysis = multiclass_support_vectors(net, x, y, x_val, y_val)
    svm = analysis.svm

    phi, wbars = materialise_phi(net, x), materialise_wbars(net)
    v = torch.from_numpy(svm.beta_).T @ phi  # (K, P): v_k = Σ_i β_ik phi(x_i)
    torch.testing.assert_close(v.sum(0), torch.zeros(phi.shape[1], dtype=torch.float64), rtol=0, atol=1e-9)
    scores = phi @ v.T
    rows = torch.arange(len(y))
    margins = scores[rows, y][:, None] - scores  # <v_{y_i} − v_k, phi(x_i)>
    alpha = torch.from_numpy(svm.alpha_)
    other = torch.ones_like(margins, dtype=torch.bool)
    other[rows, y] = False
    assert float(margins[other].min()) == pytest.approx(1.0, rel=1e-8)
    torch.testing.assert_close(margins[alpha > 0], torch.ones(int((alpha > 0).sum()), dtype=torch.float64),
                               rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(svm.functional_margins[other.numpy()], margins[other].numpy(), rtol=1e-8)
    norm_v_sq = float((v * v).sum())
    assert svm.norm_v_sq == pytest.approx(norm_v_sq, rel=1e-8) and svm.norm_v_sq == pytest.approx(
        float(alpha.sum()), rel=1e-9)
    assert svm.margin == pytest.approx(1 / math.sqrt(norm_v_sq), rel=1e-8)
    assert svm.kkt_residual < 1e-8 and svm.n_margin_violations == 0

    wc = wbars - wbars.mean(0)
    assert analysis.wc_norm == pytest.approx(float(wc.norm()), rel=1e-10)
    assert analysis.cosine == pytest.approx(float((wc * v).sum() / (wc.norm() * v.norm())), rel=1e-8)
    net_scores = phi @ wbars.T
    net_margins = (net_scores[rows, y][:, None] - net_scores)[other]
    assert analysis.network_margin == pytest.approx(float(net_margins.min() / wc.norm()), rel=1e-10)
    assert 0 < analysis.margin_ratio <= 1 + 1e-9

    phi_val = materialise_phi(net, x_val)
    decision = multiclass_decision(net, x[svm.support_], svm.beta_[svm.support_], x_val)
    torch.testing.assert_close(decision, phi_val @ v.T, rtol=1e-9, atol=1e-9)
    svm_pred, net_pred = (phi_val @ v.T).argmax(1), forward_with_slopes(net, x_val)[0].argmax(1)
    assert analysis.val_agreement == pytest.approx(float((svm_pred == net_pred).double().mean()))
    assert analysis.val_errors_network == 4
    assert analysis.val_errors_svm == int((svm_pred != y_val).sum())
    assert analysis.val_errors_both == int(((svm_pred != y_val) & (net_pred != y_val)).sum())
    counts = np.bincount(y.numpy()[svm.support_], minlength=4)
    metrics = analysis.to_metrics()
    assert metrics["n_support"] == svm.n_support_ == counts.sum()
    assert [metrics[f"n_support_class{k}"] for k in range(4)] == counts.tolist()


def test_exact_against_nnls_at_moderate_size():
    net = random_net((4, 3), num_outputs=3, in_features=10, seed=12)  # K (hence Q) is definite here
    x, y = self_labelled(net, 30, seed=13)
    kernel = path_kernel(x, forward_with_slopes(net, x)[1], bias=True).numpy()
    pairs, q = pair_gram_by_loops(kernel, y.numpy(), 3)
    expected = nnls_dual(q)
    result = multiclass_max_margin(kernel, y, 3)
    np.testing.assert_allclose([result.alpha_[i, k] for i, k in pairs], expected, rtol=1e-6,
                               atol=1e-9 * expected.max())
    assert result.norm_v_sq == pytest.approx(expected.sum(), rel=1e-8)


def test_two_classes_give_the_binary_answer():
    net = random_net((4, 3), num_outputs=2, seed=21)
    x, y = self_labelled(net, 80, seed=22)
    x_val, y_val = self_labelled(net, 40, seed=23)
    w, b = net.weights, net.biases
    difference = PathNetwork((*w[:-1], w[-1][1:] - w[-1][:1]), (*b[:-1], b[-1][1:] - b[-1][:1]), net.betas, net.gammas)
    binary = network_support_vectors(difference, x, y, x_val, y_val, kernel="dense")
    multi = multiclass_support_vectors(net, x, y, x_val, y_val)
    np.testing.assert_array_equal(multi.svm.support_, binary.svm.support_)
    # c_pq = ±2: the pair kernel is 2·y_i y_j K, so α is halved and ||V||² = ||v||² / 2
    pair_alpha = multi.svm.alpha_[np.arange(len(y)), 1 - y.numpy()]
    np.testing.assert_allclose(pair_alpha, binary.svm.alpha_ / 2, rtol=1e-8, atol=1e-12 * binary.svm.alpha_.max())
    assert multi.svm.norm_v_sq == pytest.approx(binary.svm.norm_v_sq / 2, rel=1e-9)
    assert multi.svm.margin == pytest.approx(math.sqrt(2) * binary.svm.margin, rel=1e-9)
    assert multi.network_margin == pytest.approx(math.sqrt(2) * binary.network_margin, rel=1e-9)
    assert multi.margin_ratio == pytest.approx(binary.margin_ratio, rel=1e-9)
    assert multi.cosine == pytest.approx(binary.cosine, rel=1e-9)
    assert multi.val_agreement == binary.val_agreement
    assert multi.val_errors_svm == binary.val_errors_svm
    ovr = multiclass_support_vectors(net, x, y, method="ovr").svm  # class 1 against 0 and its mirror image
    for k in range(2):
        np.testing.assert_allclose(ovr.alpha_[:, k], binary.svm.alpha_, rtol=1e-8,
                                   atol=1e-12 * binary.svm.alpha_.max())


def test_one_vs_rest_against_binary_max_margin_and_nnls():
    net = random_net((4, 3), num_outputs=3, in_features=10, seed=31)  # K is definite here
    x, y = self_labelled(net, 30, seed=32)
    kernel = path_kernel(x, forward_with_slopes(net, x)[1], bias=True).numpy()
    analysis = multiclass_support_vectors(net, x, y, x, y, method="ovr")
    ovr = analysis.svm
    assert ovr.not_separable == (None, None, None)
    phi, wbars = materialise_phi(net, x), materialise_wbars(net)
    wc = wbars - wbars.mean(0)
    for k in range(3):
        signs = np.where(y.numpy() == k, 1.0, -1.0)
        dense = max_margin(kernel, signs)
        expected = nnls_dual(kernel * np.outer(signs, signs))
        np.testing.assert_allclose(ovr.alpha_[:, k], dense.alpha_, rtol=1e-8, atol=1e-12 * dense.alpha_.max())
        np.testing.assert_allclose(ovr.alpha_[:, k], expected, rtol=1e-6, atol=1e-9 * expected.max())
        assert ovr.n_support_per_class[k] == dense.n_support_ == int((expected > 0).sum())
        v_k = phi.T @ torch.from_numpy(ovr.beta_[:, k])
        assert ovr.margins[k] == pytest.approx(1 / float(v_k.norm()), rel=1e-8)
        assert analysis.per_class_cosine[k] == pytest.approx(float(wc[k] @ v_k / (wc[k].norm() * v_k.norm())),
                                                             rel=1e-8)
        score = torch.from_numpy(signs) * (phi @ wc[k])
        assert analysis.per_class_network_margin[k] == pytest.approx(float(score.min() / wc[k].norm()), rel=1e-9)
    np.testing.assert_array_equal(ovr.support_, np.flatnonzero((ovr.alpha_ > 0).any(1)))
    assert analysis.margin_ratio is None and "margin_ratio" not in analysis.to_metrics()
    assert analysis.val_errors_svm == 0  # each class's margin >= 1 on training samples: argmax is right


def test_one_vs_rest_reports_classes_not_separable_from_the_rest():
    # three classes in 120° sectors of the plane: a line through the origin cannot cut one sector from two
    angles = torch.tensor([0.0, 2 * math.pi / 3, 4 * math.pi / 3], dtype=torch.float64)
    net = PathNetwork((torch.stack([angles.cos(), angles.sin()], 1),), None, (), ())
    theta = torch.linspace(0, 2 * math.pi, 61, dtype=torch.float64)[:-1] + 0.01
    x = torch.stack([theta.cos(), theta.sin()], 1)
    y = forward_with_slopes(net, x)[0].argmax(1)
    exact = multiclass_support_vectors(net, x, y)
    assert exact.svm.kkt_residual < 1e-8 and exact.svm.n_support_ > 0
    ovr = multiclass_support_vectors(net, x, y, method="ovr")
    assert all(msg is not None and "against the rest" in msg for msg in ovr.svm.not_separable)
    metrics = ovr.to_metrics()
    assert metrics["n_classes_not_separable"] == 3 and math.isnan(metrics["svm_margin_class0"])
    assert "class 1: not separable from the rest" in ovr.report()


def test_kernel_columns_only_for_candidate_samples_and_once_each():
    net = random_net((5, 4), num_outputs=5, in_features=4, seed=41)
    x, y = self_labelled(net, 400, seed=42)
    slopes = forward_with_slopes(net, x)[1]
    dense = path_kernel(x, slopes, bias=True).numpy()
    requested = []

    def columns(idx):
        requested.extend(idx.tolist())
        return dense[:, idx]

    lazy = multiclass_max_margin(columns, y, 5, kernel_diag=np.diag(dense).copy(),
                                 initial_margins=pair_margins(forward_with_slopes(net, x)[0], y.numpy()))
    assert len(requested) == len(set(requested)) < len(y)
    assert set(lazy.support_) <= set(requested)
    reference = multiclass_max_margin(dense, y, 5)
    np.testing.assert_array_equal(lazy.support_, reference.support_)
    np.testing.assert_allclose(lazy.alpha_, reference.alpha_, rtol=1e-8, atol=1e-12 * reference.alpha_.max())


def _structured_and_generic(kernel, y, num_classes, margins=None):
    diag = np.diag(kernel).copy()
    return [multiclass_max_margin(lambda idx: kernel[:, idx], y, num_classes, kernel_diag=diag,
                                  initial_margins=margins, structured=structured) for structured in (True, False)]


def _assert_same_solution(structured, generic):
    np.testing.assert_array_equal(structured.support_, generic.support_)
    np.testing.assert_array_equal(structured.alpha_ > 0, generic.alpha_ > 0)
    np.testing.assert_allclose(structured.alpha_, generic.alpha_, rtol=1e-9, atol=1e-11 * generic.alpha_.max())
    np.testing.assert_allclose(structured.functional_margins, generic.functional_margins, rtol=1e-9, atol=1e-10)
    assert structured.margin == pytest.approx(generic.margin, rel=1e-10)
    assert structured.kkt_residual <= 1e-10 and generic.kkt_residual <= 1e-10
    assert structured.n_support_pairs == generic.n_support_pairs


@pytest.mark.parametrize("bias, beta, num_classes", [(True, 0.1, 3), (False, 0.0, 5), (True, -1.0, 4)])
def test_structured_pair_solver_equals_generic_pair_columns(bias, beta, num_classes):
    net = random_net((6, 5), num_outputs=num_classes, in_features=5, beta=beta, bias=bias, seed=61)
    x, y = self_labelled(net, 300, seed=62)
    outputs, slopes = forward_with_slopes(net, x)
    kernel = path_kernel(x, slopes, bias=bias).numpy()
    for margins in (None, pair_margins(outputs, y.numpy())):
        structured, generic = _structured_and_generic(kernel, y, num_classes, margins)
        _assert_same_solution(structured, generic)
        # the KKT conditions recomputed from f = K β over every pair, independently of the solver
        f = kernel @ structured.beta_
        rows = np.arange(len(y))
        recomputed = f[rows, y.numpy()][:, None] - f
        others = np.ones_like(recomputed, dtype=bool)
        others[rows, y.numpy()] = False
        assert np.clip(1 - recomputed[others], 0, None).max() <= 1e-10
        assert np.abs(recomputed[structured.alpha_ > 0] - 1).max() <= 1e-10


def test_structured_pair_solver_on_duplicated_samples():
    net = random_net((4, 3), num_outputs=3, in_features=3, seed=63)
    x, y = self_labelled(net, 60, seed=64)
    x, y = torch.cat([x, x[:20]]), torch.cat([y, y[:20]])  # Q singular: degenerate steps
    kernel = path_kernel(x, forward_with_slopes(net, x)[1], bias=True).numpy()
    structured, generic = _structured_and_generic(kernel, y, 3)
    assert structured.kkt_residual <= 1e-10 and generic.kkt_residual <= 1e-10
    assert structured.margin == pytest.approx(generic.margin, rel=1e-9)
    np.testing.assert_allclose(structured.functional_margins, generic.functional_margins, rtol=1e-8, atol=1e-9)


def test_refuses_training_errors_and_bad_arguments():
    net = random_net((3,), num_outputs=3, seed=51)
    x, y = self_labelled(net, 20, seed=52)
    wrong = y.clone()
    wrong[5] = (wrong[5] + 1) % 3
    with pytest.raises(NotSeparableError, match="misclassifies 1 of 20 training samples \\(first: 5\\)"):
        multiclass_support_vectors(net, x, wrong)
    x_inf = x.clone()
    x_inf[2, 0] = math.inf
    with pytest.raises(NonFiniteError, match="training inputs are not finite at sample 2 \\(1 samples in all\\)"):
        multiclass_support_vectors(net, x_inf, y)
    with pytest.raises(ValueError, match="class labels must be integers in \\[0, 3\\), got values \\[0, 3\\]"):
        multiclass_support_vectors(net, x, torch.tensor([0, 3] * 10))
    with pytest.raises(ValueError, match="labels must have shape \\(20,\\)"):
        multiclass_support_vectors(net, x, y[:5])
    with pytest.raises(ValueError, match="`method` can be exact, ovr, got 'crammer'"):
        multiclass_support_vectors(net, x, y, method="crammer")
    with pytest.raises(ValueError, match="1 output unit: use support_vectors.network_support_vectors"):
        multiclass_support_vectors(single_output(net, 0), x, y)
    with pytest.raises(ValueError, match="x_train holds no samples"):
        multiclass_support_vectors(net, x[:0], y[:0])
    with pytest.raises(ValueError, match="x_val holds no samples"):
        multiclass_support_vectors(net, x, y, x[:0], y[:0])


def test_report_and_metrics():
    net = random_net((4, 3), num_outputs=3, seed=61)
    x, y = self_labelled(net, 60, seed=62)
    analysis = multiclass_support_vectors(net, x, y, x, y, delta=0.1)
    report = analysis.report()
    assert f"{analysis.n_support} of m=60" in report and "3 classes, exact" in report
    assert "support vectors per class: 0: " in report and "compression bound (delta=0.1, 9 bits" in report
    assert analysis.side_bits == 7 + 2  # activation bits + ⌈log2 3⌉ label bits
    metrics = analysis.to_metrics()
    for key in ("n_support", "n_support_pairs", "svm_margin", "kkt_residual", "margin_ratio", "cosine_wbar_v",
                "network_margin", "compression_bound", "n_support_class2", "val_agreement", "unique_patterns_val"):
        assert key in metrics and isinstance(metrics[key], float)
    assert metrics["val_agreement"] == 1.0 and metrics["val_errors_svm"] == 0
