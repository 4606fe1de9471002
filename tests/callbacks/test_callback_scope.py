"""NetworkSupportVectors' `scope`: the whole network by default (a CNN written with code in forward), the head
with `scope="head"`/`embedding=`, refusals and the fallback for what is not piecewise linear, MLPs on the head's
code path."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_nsv.artifacts import load_support_vectors
from lightning_nsv.callbacks import NetworkSupportVectors
from lightning_nsv.scope import NoAnalysableScopeError
from lightning_nsv.compat import pl
from lightning_nsv.datamodules import DigitsDataModule
from lightning_nsv.kernel import NotPiecewiseLinearError, compute_gates, trace, unique_patterns
from lightning_nsv.models import LeakyReLUMLP


class Residual(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return x + F.relu(self.conv(x))


class Trunk(nn.Module):
    """conv, an activation (ReLU, GELU, or ReLU after a BatchNorm of batch statistics), a residual block, max pool."""

    def __init__(self, kind="relu"):
        super().__init__()
        self.kind = kind
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4, track_running_stats=False) if kind == "batchnorm" else nn.Identity()
        self.res = Residual(4)

    def forward(self, x):
        h = self.norm(self.conv(x))
        h = F.gelu(h) if self.kind == "gelu" else F.relu(h)
        return F.max_pool2d(self.res(h), 2)


class CNN(pl.LightningModule):
    """``split``: trunk and head as two submodules (``"unnamed"``: named so that no head is found by default); else
    one nn.Sequential holding the trunk, nn.Flatten and the head, as ConvFCNet does."""

    def __init__(self, kind="relu", classes=1, split=False):
        super().__init__()
        torch.manual_seed(0)  # the same initial weights whatever ran before
        self.classes, self.split = classes, split
        head = [nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, classes)]
        if split:
            self.trunk, self.head = nn.Sequential(Trunk(kind)), nn.Sequential(*head)
            if split == "unnamed":
                self.trunk, self.head = nn.ModuleList([self.trunk]), nn.ModuleList([self.head])
        else:
            self.net = nn.Sequential(Trunk(kind), nn.Flatten(), *head)

    def forward(self, x):
        if not self.split:
            out = self.net(x)
        else:
            trunk, head = (self.trunk[0], self.head[0]) if self.split == "unnamed" else (self.trunk, self.head)
            out = head(torch.flatten(trunk(x), 1))
        return out[:, 0] if self.classes == 1 else out

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        return F.binary_cross_entropy_with_logits(out, y.float()) if self.classes == 1 else F.cross_entropy(out, y)

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def _fit(tmp_path, model, data, callback, max_epochs=60, val=None):
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=[callback], accelerator="cpu", enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                         logger=pl.loggers.TensorBoardLogger(tmp_path, name="tb", default_hp_metric=False),
                         log_every_n_steps=1)
    if isinstance(data, pl.LightningDataModule):
        trainer.fit(model, datamodule=data)
    else:
        trainer.fit(model, data, val)
    return trainer


def _text(log_dir) -> str:
    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0}).Reload()
    tag = next(t for t in events.Tags()["tensors"] if t.startswith("nsv/report"))
    return events.Tensors(tag)[-1].tensor_proto.string_val[0].decode()


def _digits(classes, m, seed=0):
    digits = load_digits()
    keep = np.flatnonzero(np.isin(digits.target, classes))
    keep = np.random.default_rng(seed).permutation(keep)[:m]
    x = torch.from_numpy(digits.images[keep] / 16.0).float().unsqueeze(1)
    return TensorDataset(x, torch.from_numpy(digits.target[keep]).long())


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("whole")
    torch.set_num_threads(1)
    model, callback = CNN(split=True), NetworkSupportVectors(save_dir=str(tmp_path / "nsv"))
    trainer = _fit(tmp_path, model, DigitsDataModule(m=40, batch_size=10, seed=0), callback)
    return trainer, model, callback, tmp_path


def test_a_cnn_with_default_arguments_is_analysed_whole(whole_run):
    trainer, model, callback, tmp_path = whole_run
    analysis = callback.analysis
    assert analysis is not None, "the tiny CNN should reach zero training error"
    x = trainer.datamodule.train_dataset.tensors[0]
    with torch.no_grad():
        graph = trace(model.eval(), x[:8])
    gates = compute_gates(graph, x)
    # bits per support vector: every gate and max-pool selection (conv 4·8·8, residual 4·8·8, pool 4·4·4, head 16)
    assert analysis.n_hidden == 4 * 64 + 4 * 64 + 4 * 16 + 16 == analysis.scope_counts.gates
    assert analysis.unique_patterns_train == unique_patterns(gates) > 1
    report = analysis.report()
    assert report.startswith("path kernel of the whole network: 4 maps, 3 gate layers, 1 max-pool, 592 gates")
    assert f"{analysis.n_hidden} bits per support vector" in report
    assert callback.metrics["scope_gates"] == 592 and callback.metrics["n_support"] == analysis.n_support
    assert callback._scope.label == "whole network"  # the summary card's heading
    assert _text(trainer.logger.log_dir).find("path kernel of the whole network: 4 maps") >= 0
    stem = tmp_path / "nsv" / f"support_vectors_epoch{callback.zero_error_epoch}"
    summary = json.loads(stem.with_suffix(".json").read_text())
    assert summary["scope"] == "whole" and summary["scope_summary"].startswith("whole network: 4 maps")
    saved = load_support_vectors(stem.with_suffix(".pt"))
    assert saved.scope == "whole" and saved.network is None
    assert saved.support.tolist() == analysis.svm.support_.tolist()


def test_the_whole_network_reproduces_from_its_file(whole_run):
    from lightning_nsv.artifacts import reproduce

    _, _, callback, tmp_path = whole_run
    saved = load_support_vectors(tmp_path / "nsv" / f"support_vectors_epoch{callback.zero_error_epoch}.pt")
    again = reproduce(saved, module=CNN(split=True))
    assert again.svm.support_.tolist() == callback.analysis.svm.support_.tolist()
    np.testing.assert_allclose(again.svm.alpha_, callback.analysis.svm.alpha_, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("arguments", [{"scope": "head"}, {"embedding": "trunk", "path_module": "head"}])
def test_the_head_scope_says_the_trunk_is_a_fixed_embedding(tmp_path, arguments, monkeypatch):
    import lightning_nsv.plotting as plotting

    cards, card = [], plotting.plot_summary_card
    monkeypatch.setattr(plotting, "plot_summary_card", lambda *a, **kw: cards.append(kw["scope"]) or card(*a, **kw))
    model = CNN(split="embedding" in arguments)
    callback = NetworkSupportVectors(save_dir=str(tmp_path / "nsv"), **arguments)
    trainer = _fit(tmp_path, model, DigitsDataModule(m=40, batch_size=10, seed=0), callback)
    assert cards == ["head only (trunk fixed)"]  # the summary card says what was analysed
    analysis = callback.analysis
    assert analysis is not None and analysis.n_hidden == 16  # the head's units only
    trunk = "`trunk` (2 Conv2d)" if "embedding" in arguments else "(2 Conv2d, Flatten)"
    where = "CNN.head" if "embedding" in arguments else "CNN.net"
    line = (f"head only: 2 Linear layers of {where} (64→16→1, gates β = 0, γ = 1); trunk {trunk} is a fixed "
            "embedding (paper 000's CNN + FC)")
    assert _text(trainer.logger.log_dir).startswith(f"**Network support vectors at epoch {callback.zero_error_epoch}**"
                                                    f"  \n{line}  \n")
    summary = json.loads(next((tmp_path / "nsv").glob("*.json")).read_text())
    assert summary["scope"] == "head" and summary["scope_summary"] == line
    assert summary["report"].startswith(line + "\n")


@pytest.mark.parametrize("kind, op", [("gelu", "gelu"), ("batchnorm", "BatchNorm2d")])
def test_what_is_not_piecewise_linear_is_refused_as_a_whole(tmp_path, kind, op):
    callback = NetworkSupportVectors(scope="whole")
    with pytest.raises(NotPiecewiseLinearError, match=rf"NetworkSupportVectors\(scope='whole'\): .*{op}.* is not "
                       r"piecewise linear .*: .*(gates that are fixed|normalises by the batch).*Choices: .*move it "
                       r"into a trunk .*`embedding=`.*`scope='head'`"):
        _fit(tmp_path, CNN(kind), DigitsDataModule(m=40, batch_size=10, seed=0), callback, max_epochs=1)


@pytest.mark.parametrize("kind, arguments, why", [
    ("gelu", {}, "it is not piecewise linear as a whole: net.0.gelu: torch._C._nn.gelu is not piecewise linear"),
    ("relu", {"intercept": True}, "`intercept=True` (the paper's SVC protocol) is an analysis of the head"),
])
@pytest.mark.filterwarnings("ignore:NetworkSupportVectors. zero training error was not reached:UserWarning")
def test_auto_falls_back_to_the_head_with_one_line_saying_why(tmp_path, monkeypatch, kind, arguments, why):
    import lightning_nsv.callbacks.nsv_scope as nsv_scope

    lines: list[str] = []  # what the callback says, whatever the logging configuration a test before left
    monkeypatch.setattr(nsv_scope, "rank_zero_info", lambda text, *args, **kwargs: lines.append(str(text)))
    callback = NetworkSupportVectors(**arguments)
    _fit(tmp_path, CNN(kind), DigitsDataModule(m=40, batch_size=10, seed=0), callback, max_epochs=1)
    said = [line for line in lines if "is not analysed because" in line]
    assert len(said) == 1 and f"the whole of CNN is not analysed because {why}" in said[0]
    assert "Analysing its head instead (head only: 2 Linear layers of CNN.net" in said[0]
    assert callback._scope.line.startswith("head only: ") and callback._scope.kind == "head"


def test_auto_without_a_head_refuses_with_both_reasons(tmp_path):
    with pytest.raises(NoAnalysableScopeError, match=r"CNN has nothing the analysis can read: .*gelu.*is not "
                       r"piecewise linear.*and it has no head: CNN: could not tell which nn.Sequential"):
        _fit(tmp_path, CNN("gelu", split="unnamed"), DigitsDataModule(m=40, batch_size=10, seed=0),
             NetworkSupportVectors(), max_epochs=1)


def test_scope_is_validated():
    with pytest.raises(ValueError, match=r"`scope` can be auto, whole, head, from:NAME, got 'all': 'whole' analyses"):
        NetworkSupportVectors(scope="all")
    with pytest.raises(ValueError, match=r"`intercept=True` \(the paper's SVC protocol\) is an analysis of the head.*"
                                         r"pass scope='head'"):
        NetworkSupportVectors(scope="whole", intercept=True)
    with pytest.raises(ValueError, match=r"`multiclass='ovr'` is an analysis of the head"):
        NetworkSupportVectors(scope="whole", multiclass="ovr")
    with pytest.raises(ValueError, match=r"`path_module`/`embedding` name a head and its trunk, but scope='whole'"):
        NetworkSupportVectors(scope="whole", embedding="trunk")


def test_an_mlp_with_defaults_is_the_head_analysis_bit_for_bit(tmp_path):
    results = {}
    for scope in ("auto", "head"):
        torch.manual_seed(0)
        model = LeakyReLUMLP(in_features=64, widths=[16, 16], lr=0.05)
        callback = NetworkSupportVectors(scope=scope)
        trainer = _fit(tmp_path / scope, model, DigitsDataModule(m=60, batch_size=20, seed=0), callback)
        results[scope] = callback.analysis, _text(trainer.logger.log_dir)
    (auto, auto_text), (head, head_text) = results["auto"], results["head"]
    assert auto is not None and type(auto) is type(head)
    assert np.array_equal(auto.svm.support_, head.svm.support_) and np.array_equal(auto.svm.alpha_, head.svm.alpha_)
    assert auto.to_metrics() == head.to_metrics()
    assert "path kernel of the whole network: 3 maps, 2 gate layers, 0 max-pools, 32 gates (a Linear/Leaky-ReLU " \
        "chain: the head's kernel)" in auto_text
    assert "head only: 3 Linear layers of LeakyReLUMLP.net (64→16→16→1, gates β = 0.1, γ = 1); no trunk" \
        in head_text


def test_three_classes_whole_and_patterns_changed_between_analyses(tmp_path):
    train, val = _digits([0, 1, 2], 60), _digits([0, 1, 2], 30, seed=1)
    callback = NetworkSupportVectors(stop_on_zero_error=False, every_n_epochs=3)
    _fit(tmp_path, CNN(classes=3, split=True), DataLoader(train, batch_size=20), callback, max_epochs=30,
         val=DataLoader(val, batch_size=30))
    analysis = callback.analysis
    assert analysis is not None and analysis.scope.startswith("whole network: 4 maps")
    assert analysis.num_classes == 3 and analysis.svm.alpha_.shape == (60, 3)
    assert len(callback.history) >= 2 and all(k in callback.history[-1] for k in ("patterns_changed",
                                                                                  "support_jaccard_previous"))
    assert 0 <= callback.history[-1]["patterns_changed"] <= 60
    assert callback.metrics["val_agreement"] >= 0


def test_the_whole_networks_outputs_are_checked_against_the_classes(tmp_path):
    with pytest.raises(ValueError, match=r"NetworkSupportVectors: CNN \(whole network\) has 3 outputs, but the data "
                                         r"module DigitsDataModule \(task='binary'\) has 2 classes"):
        _fit(tmp_path, CNN(classes=3, split=True), DigitsDataModule(m=40, batch_size=10, seed=0),
             NetworkSupportVectors(), max_epochs=1)


def test_an_analysis_traces_the_module_once_and_computes_the_training_gates_once(tmp_path, monkeypatch):
    """At zero training error: one trace with the weights of the analysis, and one float64 forward of the training set
    (the zero-error pass's, whose gates the pair network, the solver and the patterns read)."""
    import lightning_nsv.analysis.whole_network as whole_network
    import lightning_nsv.kernel.gates as gates_module
    import lightning_nsv.scope.whole as whole_scope

    traces, forwards, m = [], [], 40
    analysing = []  # from the zero-error epoch on (the cost check before training traces on its own samples)
    original_trace, original_gates = whole_scope.trace, gates_module.compute_gates

    def counted_trace(module, example):
        traces.append(len(example))
        return original_trace(module, example)

    def counted_gates(graph, x, *args, **kwargs):
        forwards.append(len(x))
        return original_gates(graph, x, *args, **kwargs)

    monkeypatch.setattr(whole_scope, "trace", counted_trace)
    for module in (whole_scope, whole_network, gates_module):
        monkeypatch.setattr(module, "compute_gates", counted_gates)
    monkeypatch.setattr(whole_network, "trace", counted_trace)
    callback = NetworkSupportVectors(save_dir=str(tmp_path / "nsv"), every_n_epochs=1000)  # checked at the last epoch
    data = DigitsDataModule(m=m, batch_size=10, seed=0)
    model = CNN(split=True)
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(max_epochs=60, callbacks=[callback], accelerator="cpu", enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0, logger=False)

    class Mark(pl.Callback):  # runs before the analysis callback's epoch end
        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch + 1 == trainer.max_epochs:
                analysing.append((len(traces), len(forwards)))

    trainer.callbacks.insert(0, Mark())
    trainer.fit(model, datamodule=data)
    assert callback.analysis is not None, "the tiny CNN should reach zero training error"
    first_trace, first_forward = analysing[0]
    assert traces[first_trace:] == [8]  # the scope's freeze: whole_network_support_vectors reuses its graph
    assert forwards[first_forward:].count(m) == 1  # the training set once; the validation set has its own
