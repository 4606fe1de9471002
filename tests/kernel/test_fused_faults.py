"""Bad and unusual input to the compiled pair program (kernel/fused.py, pair_engines.py, pair_network.py's
constructor): each gets a message that names the problem and the fix, or the right number (issue 43). The runner
reads factors without bounds checks, so what it is given is checked in Python first (kernel/pair_checks.py)."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from lightning_nsv.errors import NonFiniteError
from lightning_nsv.kernel import PairNetworkColumns, compute_gates, trace
from lightning_nsv.kernel import pair_engines
from lightning_nsv.kernel.fused import fuse
from lightning_nsv.kernel.pair_factors import sample_factors
from lightning_nsv.kernel.pair_program import NotFusable, compile_pair_program
from lightning_nsv.models.layers import mlp_sequential
from tests.kernel.test_pair_network import CASES, inputs, one_thread, relative  # noqa: F401

pytestmark = pytest.mark.skipif(not pair_engines.numba_available(), reason="numba is not installed")
ENGINE_CHOICES = "`engine` can be 'auto', 'numba', 'torch', 'reference'"


@pytest.fixture(scope="module")
def conv():
    """A conv/ReLU/Linear network on five 1×8×8 inputs: its graph, inputs, gates, program and factors."""
    torch.manual_seed(0)
    module, x = CASES["conv_relu_linear"][0]().eval(), inputs((1, 8, 8), n=5)
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    program = compile_pair_program(graph)
    return graph, x, gates, program, sample_factors(program, graph, x, gates)


def columns(graph, x, gates, **kwargs):
    return PairNetworkColumns(graph, x, gates, **{"fast": False, **kwargs})


# ------------------------------------------------------------------------------------------------------ engines


@pytest.mark.parametrize("engine", [None, "NUMBA", 3, "gpu", ["numba"]])
@pytest.mark.parametrize("options", [{}, {"factored": False}, {"fast": True}], ids=["fused", "plain", "chain"])
def test_an_unknown_engine_is_refused_whatever_network_runs(conv, engine, options):
    """(A plain network or a Linear chain took any name silently; the refusal listed no 'reference'.)"""
    graph, x, gates, *_ = conv
    if options.get("fast"):
        chain = mlp_sequential(64, [5], 1).double().eval()
        graph, x = trace(chain, x.double()), x.double()
        gates = compute_gates(graph, x)
        assert graph.chain is not None
    with pytest.raises(ValueError, match=re.escape(f"{ENGINE_CHOICES}, got {engine!r}: 'auto' runs the compiled")):
        columns(graph, x, gates, engine=engine, **options)


@pytest.mark.parametrize("engine, options", [("numba", {"factored": False}), ("torch", {"collapse": False})])
def test_a_compiled_engine_with_the_plain_network_options_is_refused(conv, engine, options):
    """(They gave the plain torch network, the engine asked for silently dropped.)"""
    graph, x, gates, *_ = conv
    with pytest.raises(ValueError, match=f"engine='{engine}' runs the compiled pair program, but factored=.* ask for "
                                         "the plain torch pair network: pass engine='reference'"):
        columns(graph, x, gates, engine=engine, **options)
    assert columns(graph, x, gates, engine="reference", **options).engine == "plain torch"


def test_numba_turned_off_by_the_environment_is_named_and_auto_runs_torch(conv, monkeypatch):
    graph, x, gates, *_ = conv
    monkeypatch.setenv("LIGHTNING_NSV_NO_NUMBA", "1")
    with pytest.raises(ValueError, match=r"engine='numba' runs on the CPU with numba, but LIGHTNING_NSV_NO_NUMBA=1 "
                                         r"turns numba off \(unset it, or set it to 0\); or use engine='torch'"):
        columns(graph, x, gates, engine="numba")
    auto = columns(graph, x, gates)
    assert auto.engine == "fused pair program (torch)"
    monkeypatch.delenv("LIGHTNING_NSV_NO_NUMBA")
    every = list(range(len(x)))
    assert relative(auto.columns_tensor(every), columns(graph, x, gates, engine="numba").columns_tensor(every)) < 1e-12


@pytest.mark.parametrize("value, off", [("0", False), ("false", False), (" No ", False), ("off", False), ("", False),
                                        ("1", True), ("true", True), ("YES", True)])
def test_no_numba_reads_false_as_false(monkeypatch, value, off):
    """(Any value but '' and '0' turned numba off: LIGHTNING_NSV_NO_NUMBA=false did.)"""
    monkeypatch.setenv("LIGHTNING_NSV_NO_NUMBA", value)
    assert pair_engines.numba_available() is not off


def test_the_torch_engine_on_the_cpu_equals_numba_and_an_unfusable_graph_says_why(conv):
    graph, x, gates, *_ = conv
    every = list(range(len(x)))
    numba, torch_ = (columns(graph, x, gates, engine=e).columns_tensor(every) for e in ("numba", "torch"))
    assert relative(torch_, numba) < 1e-12
    module, x = CASES["reshapes_functional_buffers"][0]().eval(), inputs((72,), n=5)
    graph = trace(module, x)
    gates = compute_gates(graph, x)
    for engine in ("numba", "torch"):
        with pytest.raises(NotFusable, match="Linear over the last dim of a 2-dim value"):
            columns(graph, x, gates, engine=engine)


# ------------------------------------------------------------------------------------------------- the samples


@pytest.mark.parametrize("change", ["fewer inputs", "reshaped", "flat"])
def test_fuse_refuses_inputs_that_are_not_the_gates(conv, change):
    """(fuse formed factors of 3 inputs with 5 samples' gates, or of a reshaped input, without a word.)"""
    graph, x, gates, *_ = conv
    bad = {"fewer inputs": x[:3], "reshaped": x.reshape(5, 1, 64, 1), "flat": x.reshape(5, 64)}[change]
    with pytest.raises(ValueError, match=r"inputs of shape \(\d.*\) and gates of 5 samples; the graph was traced on "
                                         r"inputs of shape \(n, 1, 8, 8\)"):
        fuse(graph, bad, gates)


def test_gates_of_another_graph_are_refused(conv):
    """(A raw torch reshape error from deep in the factors.)"""
    graph, x, *_ = conv
    other = trace(CASES["conv_stride_dilation_groups"][0]().eval(), inputs((2, 8, 8), n=5))
    wrong = compute_gates(other, inputs((2, 8, 8), n=5))
    for make in (lambda: fuse(graph, x, wrong), lambda: columns(graph, x, wrong)):
        with pytest.raises(ValueError, match=r"the gates are not this graph's: its gate layer \S+ has \(2, 8, 8\) units "
                                             r"a sample, the gates \(4, 4, 4\); compute them with compute_gates"):
            make()


def test_inputs_and_gates_of_the_wrong_type_are_named(conv):
    graph, x, gates, *_ = conv
    with pytest.raises(TypeError, match=r"the inputs must be a torch.Tensor of shape \(m, 1, 8, 8\), got ndarray"):
        columns(graph, x.numpy(), gates)
    with pytest.raises(TypeError, match=r"`gates` must be the Gates of these inputs \(gates = compute_gates\(graph, "
                                        r"x\)\), got NoneType"):
        columns(graph, x, None)
    with pytest.raises(TypeError, match="the inputs are torch.complex64: the path kernel takes real inputs"):
        columns(graph, x.to(torch.complex64), gates)  # (the imaginary part was dropped with a warning)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("engine", ["numba", "torch", "reference"])
def test_non_finite_inputs_are_refused_before_any_pair_runs(conv, monkeypatch, value, engine):
    """(The fused engines returned NaN kernel values; the columns said 'the pair network gave a non-finite kernel
    value' after running the pairs.)"""
    graph, x, gates, *_ = conv
    bad = x.clone()
    bad[3, 0, 2, 2] = value

    def no_pairs(*args, **kwargs):
        raise AssertionError("a pair was run")

    monkeypatch.setattr(pair_engines, "_run_outer", no_pairs)
    message = (r"input sample 3 holds NaN or inf \(1 of the 5 samples have non-finite entries\): the path kernel of "
               r"non-finite inputs is not defined; clean the data first")
    with pytest.raises(NonFiniteError, match=message):
        columns(graph, bad, gates, engine=engine)
    if engine != "reference":
        with pytest.raises(NonFiniteError, match=message):
            fuse(graph, bad, gates, engine)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
def test_inputs_of_another_dtype_give_the_kernel_of_their_values_in_float64(conv, dtype):
    graph, x, *_ = conv
    x = (3 * x).to(dtype)
    gates = compute_gates(graph, x)
    every = list(range(len(x)))
    fused = columns(graph, x, gates).columns_tensor(every)
    reference = columns(graph, x.double(), gates, engine="reference").columns_tensor(every)
    assert fused.dtype == torch.float64 and relative(fused, reference) < 1e-12


def test_non_contiguous_inputs_give_the_kernel_of_their_values(conv):
    graph, x, *_ = conv
    strided = x.transpose(2, 3)
    assert not strided.is_contiguous()
    gates = compute_gates(graph, strided)
    every = list(range(len(x)))
    assert torch.equal(columns(graph, strided, gates).columns_tensor(every),
                       columns(graph, strided.contiguous(), gates).columns_tensor(every))


@pytest.mark.parametrize("engine", ["numba", "torch"])
def test_one_sample_and_none(conv, engine):
    graph, x, gates, *_ = conv
    one = columns(graph, x[:1], compute_gates(graph, x[:1]), engine=engine)
    reference = columns(graph, x[:1], compute_gates(graph, x[:1]), engine="reference")
    assert one.columns([0]).shape == (1, 1) and relative(one.diagonal_tensor(), reference.diagonal_tensor()) < 1e-12
    from lightning_nsv.analysis.whole_network_validation import _slice_gates

    empty = columns(graph, x[:0], _slice_gates(gates, torch.arange(0)), engine=engine)
    assert empty.diagonal().shape == (0,) and empty.columns([]).shape == (0, 0)


@pytest.mark.parametrize("name, value, message", [
    ("memory_bytes", 0, "`memory_bytes` must be a positive integer \\(bytes\\), got 0 \\(int\\)"),
    ("memory_bytes", -5, "`memory_bytes` must be a positive integer \\(bytes\\), got -5"),
    ("memory_bytes", "1G", "`memory_bytes` must be a positive integer \\(bytes\\), got '1G' \\(str\\)"),
    ("cache_bytes", None, "cache_bytes must be >= 0, an integer \\(bytes\\), got None"),
    ("cache_bytes", 1.5, "cache_bytes must be >= 0, an integer \\(bytes\\), got 1.5 \\(float\\)"),
])
def test_byte_budgets_are_checked(conv, name, value, message):
    """(0 and -5 ran a block of one pair at a time, '1G' and None raised raw TypeErrors, 1.5 was taken.)"""
    graph, x, gates, *_ = conv
    with pytest.raises(ValueError, match=message + ".*e.g. " + name):
        columns(graph, x, gates, **{name: value})


# -------------------------------------------------------------------------------------------------- the runner


@pytest.mark.parametrize("bad", [5, -6, 10 ** 9])
def test_the_runner_refuses_indices_outside_the_samples(conv, bad):
    """(The compiled runner has no bounds checks: index 5 of 5 samples read the next row's memory, 10⁹ crashed
    the process.)"""
    graph, x, gates, program, factors = conv
    message = f"holds index {bad}, outside the 5 samples whose factors were formed \\(valid: -5 to 4\\)"
    with pytest.raises(IndexError, match="`rows` " + message):
        pair_engines.numba_outer(program, factors, np.array([0, bad]), np.arange(3))
    with pytest.raises(IndexError, match="`second` " + message):
        pair_engines.numba_pairs(program, factors, np.array([0, 1]), np.array([2, bad]))
    bits, dense = factors.tensors("cpu")
    with pytest.raises(IndexError, match="`first` " + message):
        pair_engines.torch_pairs(program, bits, dense, torch.tensor([bad, 1]), torch.tensor([2, 3]))


def test_the_runner_reads_negative_indices_as_numpy_does(conv):
    graph, x, gates, program, factors = conv
    assert np.array_equal(pair_engines.numba_outer(program, factors, np.array([-1, -5]), np.arange(3)),
                          pair_engines.numba_outer(program, factors, np.array([4, 0]), np.arange(3)))


def test_the_runner_refuses_pairs_of_two_lengths(conv):
    """(numba_pairs read past the end of the shorter array; torch_pairs raised a raw size mismatch.)"""
    graph, x, gates, program, factors = conv
    message = r"pairs \(first\[k\], second\[k\]\) need index arrays of one length, got first of 3 and second of 2"
    with pytest.raises(ValueError, match=message):
        pair_engines.numba_pairs(program, factors, np.array([0, 1, 2]), np.array([1, 2]))
    bits, dense = factors.tensors("cpu")
    with pytest.raises(ValueError, match=message):
        pair_engines.torch_pairs(program, bits, dense, torch.tensor([0, 1, 2]), torch.tensor([1, 2]))


@pytest.mark.parametrize("bad, kind", [(np.array([0.5, 1.0]), r"float64 of shape \(2,\)"),
                                       (np.array([[0, 1]]), r"int64 of shape \(1, 2\)"),
                                       (np.array([True, False]), r"bool of shape \(2,\)")])
def test_the_runner_refuses_indices_that_are_no_integer_vector(conv, bad, kind):
    """(0.5 was read as sample 0, a 2-d array raised numba's typing error.)"""
    graph, x, gates, program, factors = conv
    with pytest.raises(ValueError, match=f"`rows` must be a one-dimensional array of integer sample indices, got "
                                         f"{kind}"):
        pair_engines.numba_outer(program, factors, bad, np.arange(2))


def test_empty_index_arrays_give_empty_results(conv):
    graph, x, gates, program, factors = conv
    assert pair_engines.numba_outer(program, factors, [], np.arange(3)).shape == (0, 3)
    assert pair_engines.numba_outer(program, factors, [], []).shape == (0, 0)
    assert pair_engines.numba_pairs(program, factors, np.array([], dtype=np.int64), []).shape == (0,)
    fused = fuse(graph, x, gates, "torch")
    assert fused.outer(torch.arange(0), torch.arange(2)).shape == (0, 2)


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_the_runner_checks_its_threads(conv, threads):
    """(0 and -1 ran on torch's threads or one, silently.)"""
    graph, x, gates, program, factors = conv
    with pytest.raises(ValueError, match=f"`threads` must be a positive integer or None .*got {threads!r}"):
        pair_engines.numba_outer(program, factors, np.arange(5), np.arange(5), threads=threads)


def test_the_runner_refuses_factors_of_another_program(conv):
    """(Factors in words of 64 bits read by a program of 8-bit words: the runner read past each row.)"""
    graph, x, gates, program, factors = conv
    narrow = compile_pair_program(graph, word_bits=8)
    wide = sample_factors(compile_pair_program(graph, word_bits=64), graph, x, gates)
    with pytest.raises(ValueError, match=r"factors of 5 samples of \(\d+,\) words of 64 bits .* but the program reads "
                                         r"\d+ words of 8 bits .* form them with sample_factors\(program, graph, x, "
                                         r"gates\) of this program"):
        pair_engines.numba_outer(narrow, wide, np.arange(2), np.arange(2))
    bits, dense = wide.tensors("cpu")
    with pytest.raises(ValueError, match="but the program reads"):
        pair_engines.torch_pairs(narrow, bits, dense, torch.arange(2), torch.arange(2))


@pytest.mark.parametrize("word_bits", [0, 12, "16", True, 128])
def test_word_widths_outside_8_16_32_64_are_refused(conv, word_bits):
    with pytest.raises(ValueError, match=f"word_bits must be 8, 16, 32 or 64, got {word_bits!r}"):
        compile_pair_program(conv[0], word_bits=word_bits)


def test_a_float_word_width_is_refused(conv):
    with pytest.raises(ValueError, match="word_bits must be 8, 16, 32 or 64"):
        compile_pair_program(conv[0], word_bits=16.0)
