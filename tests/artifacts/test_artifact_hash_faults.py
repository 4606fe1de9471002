"""The content checksum of a result file under tensor layouts that a damaged file can hold: a stride on a size-1
dim (byte 786 of a real result, flipped, made its bias' stride 0) hashes like the intact tensor, and what cannot
be hashed is named as damage, never a raw error."""
import pytest
import torch

from lightning_nsv.artifacts import ArtifactCorruptError, content_sha256, load_support_vectors, save_support_vectors
from tests.artifacts.test_artifact_faults import STEM, payload

# content_sha256 of PINNED before the change of layout handling: saved results must still verify
PINNED = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": [1, 2.5, "x", None],
          "c": torch.ones(3, 2, dtype=torch.float64).T, "d": torch.tensor([7]), "e": torch.zeros(0, 2)}
PINNED_SHA256 = "01dbdf4089126b15e7d6c05ef4c17498684bc1203ef3f6f1862a93784c3a3d0b"


def strided_copy(t, stride):
    return torch.empty_strided(t.shape, stride, dtype=t.dtype).copy_(t)


def test_the_checksum_of_ordinary_tensors_is_unchanged():
    assert content_sha256(PINNED) == PINNED_SHA256


@pytest.mark.parametrize("shape, stride", [((1,), (0,)), ((1, 1), (0, 0)), ((1, 3), (0, 1)), ((3, 1), (1, 0)),
                                           ((1,), (5,))])
def test_a_stride_on_a_size_one_dim_hashes_like_the_contiguous_tensor(shape, stride):
    t = torch.arange(1.0, 1.0 + torch.Size(shape).numel()).reshape(shape)
    assert content_sha256({"w": strided_copy(t, stride)}) == content_sha256({"w": t})


def replace_w_on_load(monkeypatch, make):
    """torch.load that returns the payload with ``module_state["w"]`` replaced by ``make(w)``."""
    load = torch.load

    def damaged_load(*args, **kwargs):
        loaded = load(*args, **kwargs)
        loaded["module_state"]["w"] = make(loaded["module_state"]["w"])
        return loaded

    monkeypatch.setattr(torch, "load", damaged_load)


def test_a_zero_stride_read_from_a_file_verifies_and_loads_the_same_values(tmp_path, monkeypatch):
    pt = save_support_vectors(tmp_path, STEM, payload(state_size=1))
    replace_w_on_load(monkeypatch, lambda w: strided_copy(w, (0,)))
    loaded = load_support_vectors(pt)
    assert loaded.module_state["w"].stride() == (0,)
    assert torch.equal(loaded.module_state["w"], torch.zeros(1))


def test_content_that_cannot_be_hashed_is_named_as_damage(tmp_path, monkeypatch):
    pt = save_support_vectors(tmp_path, STEM, payload())
    replace_w_on_load(monkeypatch, lambda w: w.to_sparse())
    with pytest.raises(ArtifactCorruptError, match=r"is damaged or truncated \(its content cannot be checked: "
                                                   r"RuntimeError: .*\); restore the file from a copy"):
        load_support_vectors(pt)
