"""Pair-network columns shared by two ranks (gloo, CPU) equal one process's, and so does the analysis."""
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_nsv.analysis.whole_network import serve_whole_network_columns, whole_network_support_vectors
from lightning_nsv.kernel import ColumnSharing, PairNetworkColumns, compute_gates, trace
from lightning_nsv.kernel.pair_sharded import ShardedPairColumns
from lightning_nsv.models.residual import SmallResNet
from tests.kernel.test_pair_network import inputs, randomise_bn
from tests.kernel.test_sharded import _free_port
from tests.analysis.test_whole_network import two_classes

M = 41  # shards of unequal length


def problem():
    torch.manual_seed(3)
    net = randomise_bn(SmallResNet(1, 1, 2, (1, 1))).eval()
    x = inputs((1, 8, 8), n=M, seed=2)
    two_classes(net, x)
    with torch.no_grad():
        y = (net(x) > 0).long()
    return net, x, y


def _rank(rank: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    out = {}
    try:
        net, x, y = problem()
        graph = trace(net, x[:8])
        columns = PairNetworkColumns(graph, x, compute_gates(graph, x), memory_bytes=1 << 16)
        if rank == 0:
            with ColumnSharing() as sharing:
                provider = ShardedPairColumns(columns)
                idx = np.array([40, 3, 17])
                signs = np.where(y.numpy() > 0, 1.0, -1.0)
                out["columns"] = (provider.columns(idx), provider.signed_columns(idx, signs, 2.0))
            with ColumnSharing() as sharing:
                analysis = whole_network_support_vectors(net, x, y, sharing=sharing)
                out["support"] = analysis.svm.support_
        else:
            out["blocks"] = ShardedPairColumns(columns).serve()
            out["analysis blocks"] = serve_whole_network_columns(net, x)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    queue.put(out)


def test_two_ranks_give_the_single_process_pair_columns_and_support():
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_rank, args=(_free_port(), queue), nprocs=2, join=True)  # raises if a rank fails
    shared = {**queue.get(), **queue.get()}
    net, x, y = problem()
    graph = trace(net, x[:8])
    columns = PairNetworkColumns(graph, x, compute_gates(graph, x))
    idx = np.array([40, 3, 17])
    signs = np.where(y.numpy() > 0, 1.0, -1.0)
    plain, signed = shared["columns"]
    scale = np.abs(columns.columns(idx)).max()
    assert np.abs(plain - columns.columns(idx)).max() <= 1e-12 * scale
    assert np.abs(signed - columns.signed_columns(idx, signs, 2.0)).max() <= 1e-12 * scale
    assert shared["blocks"] > 0 and shared["analysis blocks"] > 0  # rank 1 computed its shards
    single = whole_network_support_vectors(net, x, y)
    np.testing.assert_array_equal(np.sort(shared["support"]), np.sort(single.svm.support_))
