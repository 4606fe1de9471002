"""Kernel columns shared by two ranks (gloo, CPU): the root's analysis equals one process's."""
import os
import socket

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_nsv.analysis import network_support_vectors, serve_kernel_columns
from lightning_nsv.kernel import ColumnSharing, PathKernelColumns, ShardedKernelColumns, forward_with_slopes
from tests.kernel.test_path_space import random_net
from tests.analysis.test_support_vectors import self_labelled
from tests.timeouts import timeout_for

CASES = {"relu": dict(beta=0.0, bias=False), "leaky, biases": dict(beta=0.1, bias=True)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for case, fail in [(c, False) for c in CASES] + [("relu", True), ("relu", "other data")]:
            key = f"{case}{f' {fail}' if isinstance(fail, str) else ' fail' if fail else ''}"
            net = random_net((6, 5), in_features=5, seed=4, **CASES[case])
            x, y = self_labelled(net, 301, seed=5)  # 301: shards of unequal length
            if fail == "other data" and rank == 1:
                x = x[:-1]  # a rank with another training set (one sample short)
            if rank == 0:
                try:
                    with ColumnSharing() as sharing:
                        if fail is True:
                            raise RuntimeError("the root fails before asking for a column")
                        svm = network_support_vectors(net, x, y, sharing=sharing).svm
                    out[key] = dict(support=svm.support_, alpha=svm.alpha_, kkt=svm.kkt_residual)
                except (RuntimeError, ValueError) as error:
                    out[key] = dict(error=str(error))
            else:
                out[f"{key} blocks"] = serve_kernel_columns(net, x)
            dist.barrier()  # every rank got past the service: nothing left waiting
        # the provider itself: unsigned columns, then signed ones with the labels (sent again as they changed)
        net = random_net((6, 5), in_features=5, seed=4, **CASES["leaky, biases"])
        x, y = self_labelled(net, 301, seed=5)
        columns = PathKernelColumns(x, forward_with_slopes(net, x)[1], net.betas, net.gammas, bias=True)
        if rank == 0:
            with ColumnSharing() as sharing:
                provider = sharing.columns(columns)
                idx = np.array([300, 3, 150])
                signs = np.where(y.numpy() > 0, 1.0, -1.0)
                out["direct"] = (provider(idx).numpy(), provider.signed_columns(idx, signs, 2.0),
                                 columns(idx).numpy(), columns.signed_columns(idx, signs, 2.0))
        else:
            ShardedKernelColumns(columns).serve()
    finally:
        dist.destroy_process_group()


def _run(rank, world, port, queue):
    out = {}
    _rank(rank, world, port, out)
    queue.put(out)


def test_two_ranks_computing_the_columns_give_the_single_process_solution():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_run, args=(r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    shared = {}
    for _ in procs:
        shared.update(queue.get(timeout=timeout_for(10)))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for case, options in CASES.items():
        net = random_net((6, 5), in_features=5, seed=4, **options)
        x, y = self_labelled(net, 301, seed=5)
        single = network_support_vectors(net, x, y).svm
        np.testing.assert_array_equal(shared[case]["support"], single.support_)
        np.testing.assert_allclose(shared[case]["alpha"], single.alpha_, rtol=1e-10, atol=1e-10 * single.alpha_.max())
        assert shared[case]["kkt"] <= 1e-10
        assert shared[f"{case} blocks"] > 0  # rank 1 computed its shard of every block
    # a root that fails inside the block still releases the serving rank (the barrier after it was reached)
    assert shared["relu fail"] == {"error": "the root fails before asking for a column"}
    assert shared["relu fail blocks"] == 0
    shared_plain, shared_signed, plain, signed = shared["direct"]
    np.testing.assert_allclose(shared_plain, plain, rtol=1e-14)
    np.testing.assert_allclose(shared_signed, signed, rtol=1e-14)
    # a rank with other training inputs is found before any column is shared: an error, not a wrong answer
    assert shared["relu other data"]["error"].startswith("another rank holds other training inputs")
    assert shared["relu other data blocks"] == 0
