"""Result files of whole-network analyses (issue 32): saved with their scope, loaded, reproduced from the module's
class and data module, refused when the rebuilt module computes something else; head files of every format still
load as head results."""
import dataclasses
import json
import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from lightning_nsv.analysis import whole_network_support_vectors
from lightning_nsv.artifacts import (FORMAT_VERSION, ArtifactCorruptError, ArtifactMismatchError, class_path,
                                     content_sha256, load_support_vectors, module_outputs, plain, reproduce,
                                     save_support_vectors, whole_network_payload)
from lightning_nsv.datamodules import DigitsDataModule
from lightning_nsv.models import ConvFCNet
from tests.analysis.test_whole_network import two_classes

STEM = "support_vectors_epoch2"
CNN = dict(in_channels=1, image_size=8, fc_depth=1, conv_channels=4)


def common_keys(model, data, epoch=2):
    """The keys that every result holds, as the callback's ``_save`` fills them."""
    return {
        "module_class": class_path(model), "module_hparams": plain(dict(model.hparams)),
        "module_state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "data_class": None if data is None else class_path(data),
        "data_hparams": None if data is None else plain(dict(data.hparams)),
        "train_indices": None if data is None else data.train_indices, "epoch": epoch, "global_step": 10 * epoch,
    }


def save_whole(directory, model, data, analysis, x, y):
    payload = {**common_keys(model, data), **whole_network_payload(analysis, model, x, y),
               "metrics": analysis.to_metrics()}
    return save_support_vectors(directory, STEM, payload, report=analysis.report())


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    """A small CNN (conv, Leaky ReLU, max-pool, linear head) trained (plain torch) to zero error on 100 digits,
    analysed as a whole network (validation included) and saved."""
    torch.manual_seed(0)
    data = DigitsDataModule(m=100, seed=0)
    data.setup("fit")
    model = ConvFCNet(**CNN)
    x, y = data.train_dataset.tensors
    optimiser = torch.optim.Adam(model.parameters(), lr=0.02)
    for step in range(300):
        optimiser.zero_grad()
        F.binary_cross_entropy_with_logits(model(x), y.float()).backward()
        optimiser.step()
        if step % 10 == 0 and step >= 50 and bool(((model(x) > 0).long() == y).all()):
            break
    x_val, y_val = data.val_dataset.tensors
    analysis = whole_network_support_vectors(model, x, y, x_val, y_val)
    pt = save_whole(tmp_path_factory.mktemp("nsv"), model, data, analysis, x, y)
    return analysis, load_support_vectors(pt)


def test_a_whole_network_result_round_trips_and_reproduces_the_same_support_and_alpha(binary):
    analysis, artifact = binary
    assert artifact.scope == "whole" and artifact.network is None
    assert artifact.scope_summary == analysis.scope and analysis.scope.startswith("whole network: ")
    assert artifact.outputs["values"].shape == (100,) and artifact.outputs["values"].dtype == torch.float64
    assert artifact.solver["tol"] == 1e-10 and artifact.solver["delta"] == analysis.delta
    again = reproduce(artifact)  # ConvFCNet and DigitsDataModule rebuilt from their init arguments
    assert type(again).__name__ == "WholeNetworkAnalysis" and again.scope == artifact.scope_summary
    assert torch.equal(torch.from_numpy(again.svm.support_), artifact.support)
    torch.testing.assert_close(torch.from_numpy(again.svm.alpha_), artifact.alpha, rtol=1e-8, atol=1e-12)
    assert again.val_agreement == analysis.val_agreement and again.n_support == len(artifact.support)


def test_the_saved_outputs_are_the_modules_own_outputs_in_eval_mode(binary):
    _, artifact = binary
    model = ConvFCNet(**CNN)
    model.load_state_dict(artifact.module_state)
    data = DigitsDataModule(m=100, seed=0)
    data.setup("fit")
    x = data.train_dataset.tensors[0]
    model.train()
    saved = module_outputs(model, x, max_samples=7)
    assert model.training  # the mode is restored
    assert saved["indices"].tolist() == torch.linspace(0, 99, 7).round().long().tolist()
    with torch.no_grad():
        expected = model.eval()(x[saved["indices"]]).double()
    assert torch.equal(saved["values"], expected)
    # float32 rounding of another batch composition, well inside reproduce()'s tolerance
    torch.testing.assert_close(artifact.outputs["values"][saved["indices"]], expected, rtol=1e-6, atol=1e-6)


def test_the_summary_json_states_the_scope_and_the_checksum_covers_it(binary, tmp_path):
    analysis, artifact = binary
    summary = json.loads(artifact.path.with_suffix(".json").read_text())
    assert summary["scope"] == "whole" and summary["scope_summary"] == analysis.scope
    assert summary["format_version"] == FORMAT_VERSION == 4
    saved = torch.load(artifact.path, weights_only=True)
    saved["scope_summary"] = saved["scope_summary"].replace("whole network", "head only")
    changed = tmp_path / f"{STEM}.pt"
    torch.save(saved, changed)
    with pytest.raises(ArtifactCorruptError, match="was changed after it was saved"):
        load_support_vectors(changed)


def test_a_changed_weight_is_refused_before_the_refit(binary):
    _, artifact = binary
    state = dict(artifact.module_state)
    name = next(k for k in state if k.endswith("weight"))
    state[name] = state[name].clone()
    state[name].view(-1)[0] += 0.05
    with pytest.raises(ArtifactMismatchError, match=f"computes other outputs than the analysed one in "
                                                    f"{artifact.path}: largest difference"):
        reproduce(dataclasses.replace(artifact, module_state=state))


def test_a_module_that_computes_otherwise_with_the_same_weights_is_refused(binary):
    _, artifact = binary
    with pytest.raises(ArtifactMismatchError, match="computes other outputs"):
        reproduce(artifact, module=ConvFCNet(**CNN, beta=0.3))  # same state dict, another activation


def test_a_module_of_other_shapes_is_named_as_not_the_analysed_one_with_what_to_pass(binary):
    _, artifact = binary
    wider = ConvFCNet(**{**CNN, "conv_channels": 8})
    with pytest.raises(ArtifactMismatchError, match=(
            rf"^the `module=` passed \(ConvFCNet\) differs from the module analysed in {re.escape(str(artifact.path))} "
            r"\(lightning_nsv.models.conv_fc.ConvFCNet\): net.0.weight: \(8, 1, 3, 3\) here, \(4, 1, 3, 3\) saved; .*"
            r"Its weights cannot be loaded; pass a ConvFCNet built with the analysed run's init arguments, as "
            r"recorded: ConvFCNet\(.*conv_channels=4.*\), or module=None to rebuild it from the file$")):
        reproduce(artifact, module=wider)
    deeper = ConvFCNet(**{**CNN, "fc_depth": 2})
    with pytest.raises(ArtifactMismatchError, match=r"in this module, not saved: net.13.weight, net.13.bias"):
        reproduce(artifact, module=deeper)
    with pytest.raises(ArtifactMismatchError, match=r"^the module rebuilt from lightning_nsv.models.conv_fc.ConvFCNet "
                                                    r"\(ConvFCNet\) differs .*saved, not in this module: extra.*"
                                                    r"its code has changed since the analysis"):
        reproduce(dataclasses.replace(artifact, module_state={**artifact.module_state, "extra": torch.zeros(2)}))


def test_other_training_labels_are_refused(binary):
    _, artifact = binary
    with pytest.raises(ArtifactMismatchError, match="training labels differ"):
        reproduce(dataclasses.replace(artifact, labels=-artifact.labels))


class OwnLabels:
    """A data module (duck-typed) of digits labelled by a network's own argmax: zero training error at once."""

    def __init__(self, x, y, x_val, y_val):
        self.train_dataset, self.val_dataset = TensorDataset(x, y), TensorDataset(x_val, y_val)

    def setup(self, stage):
        pass


def test_a_k_class_whole_network_result_reproduces_with_a_given_module_and_data(tmp_path):
    torch.manual_seed(1)
    model = ConvFCNet(**CNN, num_classes=3).eval()
    data = DigitsDataModule(m=60, seed=1)
    data.setup("fit")
    x, x_val = data.train_dataset.tensors[0], data.val_dataset.tensors[0][:40]
    two_classes(model, x)
    with torch.no_grad():
        y, y_val = model(x).argmax(1), model(x_val).argmax(1)
    analysis = whole_network_support_vectors(model, x, y, x_val, y_val, num_classes=3)
    pt = save_whole(tmp_path, model, None, analysis, x, y)
    artifact = load_support_vectors(pt)
    assert artifact.outputs["values"].shape == (60, 3) and artifact.labels.dtype == torch.int64
    with pytest.raises(ValueError, match="records no data module; pass `datamodule=`"):
        reproduce(artifact)
    again = reproduce(artifact, module=ConvFCNet(**CNN, num_classes=3), datamodule=OwnLabels(x, y, x_val, y_val))
    assert type(again).__name__ == "WholeNetworkMulticlassAnalysis"
    assert torch.equal(torch.from_numpy(again.svm.support_), artifact.support)
    torch.testing.assert_close(torch.from_numpy(again.svm.alpha_), artifact.alpha, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("change, message", [
    (lambda p: p.update(network={"weights": [torch.zeros(1, 2)]}), "a whole-network result holds no 'network'"),
    (lambda p: p.pop("outputs"), "a whole-network result must hold 'outputs'"),
    (lambda p: p.update(scope_summary=None), "a whole-network result must hold 'scope_summary'"),
    (lambda p: p.update(embedding="net.0"), "'embedding' must be None"),
    (lambda p: p.update(scope="trunk"), "'scope' must be one of 'head', 'whole', 'cut', got 'trunk'"),
])
def test_a_whole_network_payload_that_does_not_fit_is_refused_before_anything_is_written(binary, tmp_path, change,
                                                                                         message):
    _, artifact = binary
    payload = torch.load(artifact.path, weights_only=True)
    for key in ("id", "sha256", "format_version", "versions", "report"):
        payload.pop(key)
    change(payload)
    with pytest.raises(ValueError, match=message):
        save_support_vectors(tmp_path, STEM, payload)
    assert not list(tmp_path.iterdir())


def test_a_head_analysis_is_not_saved_as_a_whole_network_result():
    from types import SimpleNamespace

    with pytest.raises(TypeError, match="must be the result of whole_network_support_vectors"):
        whole_network_payload(SimpleNamespace(svm=None), torch.nn.Linear(2, 1), torch.zeros(3, 2), [0, 1, 1])


# ---- head results: saved as "head", and files before format 4 read as head -----------------------------------

def head_payload():
    from tests.artifacts.test_artifact_faults import payload

    return payload()


def test_a_head_result_is_saved_with_its_scope_and_a_format_3_file_reads_as_head(tmp_path):
    pt = save_support_vectors(tmp_path, STEM, head_payload())
    assert json.loads(pt.with_suffix(".json").read_text())["scope"] == "head"
    assert load_support_vectors(pt).scope == "head"
    old = torch.load(pt, weights_only=True)  # as lightning_nsv wrote it before format 4: no scope anywhere
    old.pop("scope")
    old["format_version"] = 3
    old["sha256"] = content_sha256(old)
    torch.save(old, pt)
    summary = json.loads(pt.with_suffix(".json").read_text())
    for key in ("scope", "scope_summary"):
        summary.pop(key)
    summary.update(format_version=3, sha256=old["sha256"])
    pt.with_suffix(".json").write_text(json.dumps(summary))
    artifact = load_support_vectors(pt)
    assert artifact.scope == "head" and artifact.scope_summary is None
    assert artifact.network.hidden_widths == (3,)
