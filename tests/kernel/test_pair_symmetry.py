"""Kept columns and the symmetry ``K[r, j] = K[j, r]`` of PairNetworkColumns (lightning_nsv.kernel.column_cache):
the same kernel as the pair network on every pair, with each unordered pair evaluated about once."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from lightning_nsv.analysis import whole_network
from lightning_nsv.kernel import PairNetworkColumns, compute_gates, trace
from lightning_nsv.models.layers import LeakyReLUFamily, mlp_sequential
from lightning_nsv.models.residual import SmallResNet
from tests.kernel.test_pair_network import inputs, one_thread, randomise_bn, relative  # noqa: F401 (autouse fixture)

TOL = 1e-13
M = 37  # not a multiple of a chunk


def cnn(beta: float = 0.0) -> nn.Module:
    """conv → Leaky ReLU → max pool → conv → Leaky ReLU → flatten → Linear on 8×8 inputs."""
    return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), LeakyReLUFamily(beta, 1.0), nn.MaxPool2d(2),
                         nn.Conv2d(2, 2, 3, padding=1), LeakyReLUFamily(beta, 1.0), nn.Flatten(), nn.Linear(32, 1))


NETS = {"resnet": lambda: randomise_bn(SmallResNet(1, 1, 2, (1, 1))).eval(), "cnn_leaky": lambda: cnn(0.1)}


def provider(name: str = "resnet", m: int = M, **kwargs) -> PairNetworkColumns:
    torch.manual_seed(0)
    x = inputs((1, 8, 8), n=m, seed=4)
    graph = trace(NETS[name](), x)
    # 30 pairs a plain block: chunks of 8-10 columns, so that requests span several chunks and tiles
    return PairNetworkColumns(graph, x, compute_gates(graph, x), memory_bytes=8 * graph.peak_elements * 30, **kwargs)


def uncached(columns: PairNetworkColumns, rows, cols) -> torch.Tensor:
    """``K[rows][:, cols]`` by the pair network on every pair (no cache, no symmetry)."""
    return columns._tiles(torch.as_tensor(rows, dtype=torch.long), torch.as_tensor(cols, dtype=torch.long))


def chunk_width(columns: PairNetworkColumns, n: int) -> int:
    return columns._tile_shape(len(columns), n)[1]


@pytest.mark.parametrize("name", sorted(NETS))
def test_dense_kernel_is_the_pair_network_and_costs_half_the_pairs(name):
    columns = provider(name)
    full = uncached(columns, range(M), range(M))
    columns.pairs_evaluated = 0
    kernel = columns.columns_tensor(np.arange(M))
    assert relative(kernel, full) < TOL
    assert relative(kernel, kernel.T) < TOL
    w = chunk_width(columns, M)
    assert 1 < w < M
    chunks = math.ceil(M / w)
    assert M * (M + 1) // 2 <= columns.pairs_evaluated <= M * (M + 1) // 2 + chunks * w * (w - 1) // 2
    assert len(columns.cache) == M
    columns.pairs_evaluated = 0
    again = columns.columns_tensor(np.arange(M)[::-1].copy())
    assert columns.pairs_evaluated == 0 and torch.equal(again, kernel.flip(1))


def test_growing_requests_like_the_solver_evaluate_each_pair_once():
    """Blocks of new samples (the solver admitting candidates), each with some already asked for: a chunk of ``b``
    new columns costs ``b·(m − kept)`` pairs exactly (its rows that are kept columns, or columns of an earlier chunk,
    are read; the others run)."""
    columns = provider(cache_bytes=8 * M * M)
    full = uncached(columns, range(M), range(M))
    order = np.random.default_rng(0).permutation(M)
    columns.pairs_evaluated, expected, kept = 0, 0, 0
    for lo in range(0, M, 5):
        new = order[lo:lo + 5]
        idx = np.concatenate([new, order[max(0, lo - 3):lo]])  # with three columns kept already
        got = columns.columns_tensor(idx)
        assert relative(got, full[:, idx]) < TOL
        w = chunk_width(columns, len(np.unique(idx)))
        for chunk in [new[i:i + w] for i in range(0, len(new), w)]:
            expected += len(chunk) * (M - kept)
            kept += len(chunk)
        assert columns.pairs_evaluated == expected
    assert expected <= M * (M + 1) // 2 + math.ceil(M / 5) * 10 < M * M * 0.6


@pytest.mark.parametrize("cache_bytes", [8 * M * M, 8 * 5 * 5, 0])
def test_columns_after_the_block_of_their_candidates_read_the_block(cache_bytes):
    """The solver asks for the block of its candidates, then for the columns of those it admits: their rows among
    the candidates come from the block (kept when ``8·b²`` fits the budget; 8·5² bytes hold no column of 37 rows),
    so ``a`` new columns among ``b`` candidates cost ``a·(m − |kept ∪ candidates|)`` pairs."""
    columns = provider(cache_bytes=cache_bytes)
    full = uncached(columns, range(M), range(M))
    order = np.random.default_rng(1).permutation(M)
    kept = set()
    for lo in range(0, M, 5):
        candidates = order[lo:lo + 5]
        assert relative(columns.block(candidates), full[candidates][:, candidates]) < TOL
        admitted = candidates[::2]
        if lo and columns.cache.capacity:
            admitted = np.concatenate([admitted, order[:1]])  # a kept column among them
        columns.pairs_evaluated = 0
        assert relative(columns.columns_tensor(admitted), full[:, admitted]) < TOL
        new = {int(j) for j in admitted} - kept
        if cache_bytes:
            assert columns.pairs_evaluated == len(new) * (M - len(kept | set(candidates)))
        else:
            assert columns.pairs_evaluated >= len(new) * (M - len(new))
        kept |= new if columns.cache.capacity else set()


def test_duplicated_indices():
    columns = provider()
    full = uncached(columns, range(M), range(M))
    columns.columns_tensor([3, 5])
    idx = np.array([7, 3, 7, 20, 3, 20, 0])
    assert relative(columns.columns_tensor(idx), full[:, idx]) < TOL
    assert relative(columns.block(idx), full[idx][:, idx]) < TOL
    assert relative(provider(cache_bytes=0).columns_tensor(idx), full[:, idx]) < TOL


def test_columns_are_not_views_of_the_cache():
    """The solver owns (and compacts in place) what it is given: writing into it leaves the kept columns."""
    columns = provider()
    first = columns.columns_tensor([2, 9])
    expected = first.clone()
    first.fill_(np.nan)
    columns.signed_rows(np.array([2, 9]), np.ones(M), 1.0).fill_(np.nan)
    assert torch.equal(columns.columns_tensor([2, 9]), expected)


def test_row_slices_read_kept_columns_and_keep_none():
    """A DDP shard (``part``) gets its rows of kept columns and runs the others; it keeps nothing (its columns
    lack the rows the symmetry needs)."""
    columns = provider()
    full = uncached(columns, range(M), range(M))
    shard = slice(3, 22)
    columns.pairs_evaluated = 0
    got = columns.columns_tensor([30, 4, 4, 12], part=shard)
    assert relative(got, full[shard][:, [30, 4, 4, 12]]) < TOL
    assert len(columns.cache) == 0 and columns.pairs_evaluated == 19 * 3
    columns.columns_tensor([4, 12])  # kept
    columns.pairs_evaluated = 0
    got = columns.columns_tensor([30, 4, 12, 31], part=shard)
    assert relative(got, full[shard][:, [30, 4, 12, 31]]) < TOL
    assert columns.pairs_evaluated == (19 - 2) * 2  # rows 4 and 12 of the new columns: from the kept ones
    assert len(columns.cache) == 2
    assert relative(columns.columns_tensor([1, 30], part=slice(0, M)), full[:, [1, 30]]) < TOL
    assert len(columns.cache) == 4  # all rows: kept


def test_block_reads_kept_columns_and_runs_the_upper_triangle():
    columns = provider()
    full = uncached(columns, range(M), range(M))
    idx = np.arange(M)[::-1].copy()
    columns.pairs_evaluated = 0
    block = columns.block(idx)
    assert relative(block, full[idx][:, idx]) < TOL
    w = columns._tile_shape(M, M)[1]
    tiles = math.ceil(M / w)
    assert M * (M + 1) // 2 <= columns.pairs_evaluated <= M * (M + 1) // 2 + tiles * w * (w - 1) // 2
    assert len(columns.cache) == 0  # a block holds no whole columns
    columns.columns_tensor([5, 6, 30])
    columns.pairs_evaluated = 0
    some = np.array([30, 1, 5, 2, 6])
    assert relative(columns.block(some), full[some][:, some]) < TOL
    assert columns.pairs_evaluated == 4  # the pairs of 1 and 2 only (one 2×2 tile)
    columns.pairs_evaluated = 0
    assert relative(columns.block([6, 5, 5]), full[[6, 5, 5]][:, [6, 5, 5]]) < TOL
    assert columns.pairs_evaluated == 0
    assert relative(columns.block([1, 2, 30]), full[[1, 2, 30]][:, [1, 2, 30]]) < TOL
    columns.pairs_evaluated = 0
    assert relative(columns.columns_tensor([2, 20, 1]), full[:, [2, 20, 1]]) < TOL  # 20 is not in the block
    assert columns.pairs_evaluated == 3 * (M - 3)  # only the rows of the kept columns 5, 6, 30 read


def test_no_cache_keeps_nothing_but_a_call_still_uses_its_own_columns():
    columns = provider(cache_bytes=0)
    full = uncached(columns, range(M), range(M))
    columns.pairs_evaluated = 0
    assert relative(columns.columns_tensor(np.arange(M)), full) < TOL
    first = columns.pairs_evaluated
    assert first < 0.7 * M * M and len(columns.cache) == 0 and columns.cache.nbytes == 0
    idx = np.array([3, 1])
    columns.pairs_evaluated = 0
    assert relative(columns.columns_tensor(idx), full[:, idx]) < TOL
    assert columns.pairs_evaluated == 2 * M
    columns.pairs_evaluated = 0
    columns.columns_tensor(idx)
    assert columns.pairs_evaluated == 2 * M  # nothing kept


def test_a_budget_for_some_columns_keeps_the_first_ones():
    kept = 12
    columns = provider(cache_bytes=8 * M * kept + 8 * M - 1)
    full = uncached(columns, range(M), range(M))
    assert relative(columns.columns_tensor(np.arange(M)), full) < TOL
    assert len(columns.cache) == kept and columns.cache.nbytes <= 8 * M * kept
    columns.pairs_evaluated = 0
    assert relative(columns.columns_tensor([0, 11]), full[:, [0, 11]]) < TOL
    assert columns.pairs_evaluated == 0
    assert relative(columns.columns_tensor([12, 36, 5]), full[:, [12, 36, 5]]) < TOL
    assert columns.pairs_evaluated == 2 * (M - kept)  # rows 0..11 of columns 12 and 36 read from the kept ones
    assert len(columns.cache) == kept


def test_negative_budget_refused():
    with pytest.raises(ValueError, match="cache_bytes must be >= 0"):
        provider(cache_bytes=-1)


def test_linear_chain_keeps_its_fast_path():
    torch.manual_seed(0)
    module = mlp_sequential(6, [5, 4], 1, beta=0.1, bias=True)
    x = torch.randn(20, 6)
    graph = trace(module, x)
    columns = PairNetworkColumns(graph, x, compute_gates(graph, x))
    kernel = columns.columns_tensor(np.arange(20))
    plain = PairNetworkColumns(graph, x, compute_gates(graph, x), fast=False, cache_bytes=0)
    assert relative(kernel, uncached(plain, range(20), range(20))) < 1e-12
    assert columns.pairs_evaluated == 0 and len(columns.cache) == 0


def test_analysis_gives_the_same_support_with_and_without_the_cache(monkeypatch):
    """A tiny CNN whose own labels it fits (no training): the support and α of the analysis do not depend on the
    cache, and the cache spares pairs."""
    torch.manual_seed(5)
    net = cnn(0.0).eval()
    x = inputs((1, 8, 8), n=48, seed=6)
    with torch.no_grad():
        y = (net(x)[:, 0] > 0).long()
    made = []

    def run(cache_bytes):
        def build(*args, **kwargs):
            made.append(PairNetworkColumns(*args, **{**kwargs, "cache_bytes": cache_bytes}))
            return made[-1]
        monkeypatch.setattr(whole_network, "PairNetworkColumns", build)
        result = whole_network.whole_network_support_vectors(net, x, y, x[:10], y[:10])
        return result, made[0].pairs_evaluated

    cached, cached_pairs = run(1 << 30)
    made.clear()
    plain, plain_pairs = run(0)
    assert len(cached.svm.support_) > 10
    np.testing.assert_array_equal(cached.svm.support_, plain.svm.support_)
    assert relative(torch.from_numpy(cached.svm.alpha_), torch.from_numpy(plain.svm.alpha_)) < 1e-10
    assert abs(cached.cosine - plain.cosine) < 1e-10 and cached.val_agreement == plain.val_agreement
    assert cached_pairs < plain_pairs


def test_the_cache_takes_only_memory_the_solver_can_never_need(monkeypatch):
    """The analysis gives the columns' cache what its memory budget leaves after the allocations before the solve and
    all m columns of the solver: a budget that holds just those keeps no column (and the analysis still runs), no
    budget the default."""
    from lightning_nsv.analysis.whole_network_memory import cache_budget
    from lightning_nsv.kernel.pair_network import CACHE_BYTES

    assert cache_budget(100, None, 10) == CACHE_BYTES
    assert cache_budget(100, (100 + 800 + 64, "limit"), 10) == 64
    assert cache_budget(100, (100 + 799, "limit"), 10) == 0
    assert cache_budget(0, (1 << 40, "limit"), 10) == CACHE_BYTES
    torch.manual_seed(5)
    net = cnn(0.0).eval()
    x = inputs((1, 8, 8), n=24, seed=6)
    with torch.no_grad():
        y = (net(x)[:, 0] > 0).long()
    made = []

    def build(*args, **kwargs):
        made.append(PairNetworkColumns(*args, **kwargs))
        return made[-1]
    monkeypatch.setattr(whole_network, "PairNetworkColumns", build)
    parts = whole_network.memory_estimate(whole_network._trace(net, x), len(x), 0)
    whole_network.whole_network_support_vectors(net, x, y, memory_bytes=parts["total"] + 8 * len(x) ** 2 + 8 * 24 * 5)
    assert made[0].cache.capacity == 5
    made.clear()
    whole_network.whole_network_support_vectors(net, x, y, memory_bytes=parts["total"] + 8 * len(x) ** 2)
    assert made[0].cache.capacity == 0 and len(made[0].cache) == 0


def test_requests_split_evenly_so_no_tile_is_narrow(monkeypatch):
    """A request a little wider than a tile (the solver asks for ~√m columns at a time) is cut into even chunks,
    not a full one and a sliver: every tile stays wide enough for the factored network."""
    from lightning_nsv.kernel import column_cache

    assert [len(c) for c in column_cache.even_split(torch.arange(44), 39)] == [22, 22]
    assert [len(c) for c in column_cache.even_split(torch.arange(10), 3)] == [3, 3, 2, 2]
    assert column_cache.even_split(torch.arange(0), 4) == ()
    torch.manual_seed(0)
    net = cnn(0.0).eval()
    x = inputs((1, 8, 8), n=40, seed=2)
    graph = trace(net, x)
    columns = PairNetworkColumns(graph, x, compute_gates(graph, x), cache_bytes=0, engine="reference",
                                 memory_bytes=50 * 8 * graph.peak_elements)  # 50 plain pairs, tiles of 20 columns
    _, width = columns._tile_shape(len(x), len(x))
    assert width == 20
    shapes = []
    original = PairNetworkColumns.pairs
    monkeypatch.setattr(PairNetworkColumns, "pairs",
                        lambda self, a, b, outer=False: shapes.append((len(a), len(b))) or original(self, a, b, outer))
    wanted = torch.arange(min(len(x), width + 2))
    got = columns.columns_tensor(wanted)
    assert shapes and min(min(r, c) for r, c in shapes) >= columns.factored_min_side
    assert relative(got, columns._tiles(torch.arange(len(x)), wanted)) < 1e-13
