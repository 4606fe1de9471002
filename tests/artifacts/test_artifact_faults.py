"""Result files under faults: a failed or killed save keeps the previous result, damaged or changed files are
named as such, and reproduce() refuses a network that computes something else (issue 30)."""
import dataclasses
import errno
import json
import os
import resource
import signal
import threading
import warnings

import numpy as np
import pytest
import torch

from lightning_nsv import atomic
from lightning_nsv.artifacts import (FORMAT_VERSION, ArtifactCorruptError, ArtifactMismatchError, content_sha256,
                                     load_support_vectors, network_outputs, reproduce, save_support_vectors)
from lightning_nsv.kernel import PathNetwork

STEM = "support_vectors_epoch3"
UNSAFE_ADVICE = ("weights_only=False", "weights_only set to False", "arbitrary code")


def payload(scale=1.0, state_size=4):
    net = PathNetwork.from_tensors([torch.randn(3, 2, dtype=torch.float64), torch.randn(1, 3, dtype=torch.float64)],
                                   None, [0.0], [1.0])
    return {
        "support": torch.tensor([0, 2]), "alpha": torch.tensor([0.5, 0.0, 0.25], dtype=torch.float64) * scale,
        "intercept": 0.0, "labels": torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64),
        "network": {"weights": list(net.weights), "biases": None, "betas": [0.0], "gammas": [1.0]},
        "path_part": "Net.model", "path_module": None, "embedding": None, "module_class": None,
        "module_hparams": None, "module_state": {"w": torch.arange(state_size, dtype=torch.float32)},
        "data_class": None, "data_hparams": None, "train_indices": torch.tensor([4, 7, 9]), "epoch": 3,
        "global_step": 30, "solver": {"intercept": False, "C": 1e7, "kernel": "auto", "max_dense_bytes": 1 << 30},
        "metrics": {"n_support": 2.0, "kkt_residual": float("nan")},
    }


def files(directory):
    """Every file in ``directory`` (hidden ones included) with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())} if directory.exists() else {}


def first_result(tmp_path):
    pt = save_support_vectors(tmp_path, STEM, payload())
    return pt, files(tmp_path), load_support_vectors(pt)


def assert_previous_result(directory, before, previous):
    """The previous pair is on disk byte for byte, nothing else is, and it loads as what it was."""
    assert files(directory) == before
    again = load_support_vectors(directory / f"{STEM}.pt")
    assert again.id == previous.id and torch.equal(again.alpha, previous.alpha)


class FaultyOs:
    """``os`` for lightning_nsv.atomic, with a fault at the ``fault_at``-th write, fsync, link or rename (a
    raised ``OSError``, or a SIGKILL of this process, a write killed half-way); ``steps`` records each call."""

    OPERATIONS = ("write", "fsync", "link", "replace")

    def __init__(self, fault_at=None, kill=False, persistent=False, error=errno.EIO):
        self.fault_at, self.kill, self.persistent, self.error, self.steps = fault_at, kill, persistent, error, []

    def __getattr__(self, name):
        real = getattr(os, name)
        if name not in self.OPERATIONS:
            return real

        def operation(*args, **kwargs):
            label = name
            if name == "fsync":
                label = "fsync dir" if os.path.isdir(f"/proc/self/fd/{args[0]}") else "fsync file"
            self.steps.append(label)
            n = len(self.steps)
            if self.fault_at is not None and (n == self.fault_at or self.persistent and n > self.fault_at):
                if self.kill:
                    if name == "write":  # killed in the middle of the write: half of the data is on disk
                        real(args[0], args[1][: len(args[1]) // 2])
                    os.kill(os.getpid(), signal.SIGKILL)
                raise OSError(self.error, os.strerror(self.error))
            return real(*args, **kwargs)

        return operation


def steps_of_a_save(tmp_path, monkeypatch):
    """The steps of a save over a previous pair."""
    save_support_vectors(tmp_path / "count", STEM, payload())
    recorder = FaultyOs()
    monkeypatch.setattr(atomic, "os", recorder)
    save_support_vectors(tmp_path / "count", STEM, payload())
    monkeypatch.setattr(atomic, "os", os)
    return recorder.steps


def test_a_save_passes_through_every_step_that_the_fault_tests_break(tmp_path, monkeypatch):
    steps = steps_of_a_save(tmp_path, monkeypatch)
    assert steps == ["write", "fsync file", "write", "fsync file", "link", "link", "fsync dir", "replace",
                     "replace", "fsync dir", "fsync dir"]  # the last one after the backups are removed


def steps_before_the_save_is_done(tmp_path, monkeypatch):
    """Every step of a save up to its end: the removal of the backups (the last fsync comes after it)."""
    return steps_of_a_save(tmp_path, monkeypatch)[:-1]


def test_a_fault_after_the_backups_are_removed_does_not_fail_the_save(tmp_path, monkeypatch):
    steps = steps_of_a_save(tmp_path, monkeypatch)
    pt, _, previous = first_result(tmp_path / "late")
    monkeypatch.setattr(atomic, "os", FaultyOs(len(steps)))
    save_support_vectors(tmp_path / "late", STEM, payload(scale=2.0))
    monkeypatch.setattr(atomic, "os", os)
    assert torch.equal(load_support_vectors(pt).alpha, previous.alpha * 2)
    assert sorted(files(tmp_path / "late")) == [f"{STEM}.json", f"{STEM}.pt"]


@pytest.mark.parametrize("persistent", [False, True], ids=["one-fault", "disk-stays-broken"])
def test_a_fault_at_any_step_of_a_save_keeps_the_previous_result(tmp_path, monkeypatch, persistent):
    steps = steps_before_the_save_is_done(tmp_path, monkeypatch)
    for fault_at, step in enumerate(steps, start=1):
        directory = tmp_path / f"{fault_at}"
        pt, before, previous = first_result(directory)
        monkeypatch.setattr(atomic, "os", FaultyOs(fault_at, persistent=persistent))
        with pytest.raises(OSError, match=f"could not save the support-vector result {pt}: .*Input/output error"):
            save_support_vectors(directory, STEM, payload(scale=2.0))
        monkeypatch.setattr(atomic, "os", os)
        if persistent:  # the rollback failed as well: backups may stay, and the loader reads them where needed
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                again = load_support_vectors(pt)
            assert again.id == previous.id and torch.equal(again.alpha, previous.alpha), step
            assert set(files(directory)) <= {f"{STEM}.json", f"{STEM}.pt", f".{STEM}.json.prev", f".{STEM}.pt.prev"}
            save_support_vectors(directory, STEM, payload(scale=3.0))  # the next save cleans up
            assert sorted(files(directory)) == [f"{STEM}.json", f"{STEM}.pt"], step
        else:
            assert_previous_result(directory, before, previous)


def test_a_fault_at_any_step_of_a_first_save_leaves_no_result(tmp_path, monkeypatch):
    steps = [s for s in steps_before_the_save_is_done(tmp_path, monkeypatch) if s != "link"]  # nothing to keep
    for fault_at, step in enumerate(steps, start=1):
        directory = tmp_path / f"{fault_at}"
        monkeypatch.setattr(atomic, "os", FaultyOs(fault_at))
        with pytest.raises(OSError, match="could not save the support-vector result"):
            save_support_vectors(directory, STEM, payload())
        monkeypatch.setattr(atomic, "os", os)
        assert files(directory) == {}, step
        with pytest.raises(FileNotFoundError):
            load_support_vectors(directory / STEM)


def killed_save(directory, fault_at, scale=2.0):
    """Run a save in a forked child that SIGKILLs itself at step ``fault_at``; True if it was killed."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            atomic.os = FaultyOs(fault_at, kill=True)
            save_support_vectors(directory, STEM, payload(scale=scale))
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


@pytest.mark.parametrize("previous_json", [True, False], ids=["pair", "pt-without-json"])
def test_a_save_killed_at_any_step_keeps_the_previous_result_and_the_next_save_cleans_up(tmp_path, monkeypatch,
                                                                                         previous_json):
    steps = steps_before_the_save_is_done(tmp_path, monkeypatch)
    if not previous_json:
        steps.remove("link")  # no .json to keep
    for fault_at, step in enumerate(steps, start=1):
        directory = tmp_path / f"{fault_at}"
        pt, before, previous = first_result(directory)
        if not previous_json:  # e.g. removed by hand: the previous result is the .pt alone
            pt.with_suffix(".json").unlink()
            before = files(directory)
        assert killed_save(directory, fault_at), step
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            again = load_support_vectors(pt)
        assert again.id == previous.id and torch.equal(again.alpha, previous.alpha), step
        if any(files(directory).get(name) != before.get(name) for name in (f"{STEM}.pt", f"{STEM}.json")):
            # killed after a rename: the backups hold the previous pair, and the loader says so
            assert any(f"was interrupted: its previous version is still beside it (.{STEM}" in str(w.message)
                       for w in caught), step
        newest = save_support_vectors(directory, STEM, payload(scale=3.0))
        assert sorted(files(directory)) == [f"{STEM}.json", f"{STEM}.pt"], step  # no temporaries, no backups
        assert torch.equal(load_support_vectors(newest).alpha, previous.alpha * 3)


def test_a_first_save_killed_at_any_step_leaves_no_result(tmp_path, monkeypatch):
    steps = [s for s in steps_before_the_save_is_done(tmp_path, monkeypatch) if s != "link"]
    for fault_at, step in enumerate(steps, start=1):
        directory = tmp_path / f"{fault_at}"
        directory.mkdir()
        assert killed_save(directory, fault_at), step
        if fault_at < len(steps):  # before the .pt was renamed into place
            with pytest.raises(FileNotFoundError, match="no support-vector result at"):
                load_support_vectors(directory / STEM)
        else:
            assert load_support_vectors(directory / STEM).epoch == 3


def test_no_space_left_while_writing_the_json_keeps_the_previous_pair(tmp_path, monkeypatch):
    """The tester's case: the .pt is written, the .json hits a full disk."""
    pt, before, previous = first_result(tmp_path)
    real_write = os.write

    def full_disk_at_json(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").split("/")[-1].startswith(f".{STEM}.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk_at_json)
    with pytest.raises(OSError, match=f"{pt}: writing .*{STEM}.json failed: No space left on device; free space"):
        save_support_vectors(tmp_path, STEM, payload(scale=2.0))
    monkeypatch.undo()
    assert_previous_result(tmp_path, before, previous)


def test_a_file_size_limit_names_the_file_and_keeps_the_previous_pair(tmp_path):
    pt, before, previous = first_result(tmp_path)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, hard))
    try:
        with pytest.raises(OSError, match=f"{pt}: writing {pt} failed: File too large; .*ulimit -f") as caught:
            save_support_vectors(tmp_path, STEM, payload(state_size=100_000))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert caught.value.errno == errno.EFBIG and caught.value.filename == str(pt)
    assert_previous_result(tmp_path, before, previous)


def test_file_systems_without_hard_links_keep_the_previous_result_by_a_copy(tmp_path, monkeypatch):
    pt, before, previous = first_result(tmp_path)

    class NoHardLinks(FaultyOs):
        def __getattr__(self, name):
            if name == "link":
                return lambda *args, **kwargs: (_ for _ in ()).throw(OSError(errno.EPERM, os.strerror(errno.EPERM)))
            if name == "replace":
                return self.replace
            return getattr(os, name)

        def replace(self, source, target):  # fails once: at the new .pt, after the new .json is in place
            if str(source).endswith(".tmp") and str(target).endswith(f"{STEM}.pt"):
                raise OSError(errno.EIO, "Input/output error")
            os.replace(source, target)

    monkeypatch.setattr(atomic, "os", NoHardLinks())
    with pytest.raises(OSError, match=f"renaming the new file onto {pt} failed"):
        save_support_vectors(tmp_path, STEM, payload(scale=2.0))
    monkeypatch.setattr(atomic, "os", os)
    assert_previous_result(tmp_path, before, previous)


def test_a_directory_fsync_that_the_file_system_does_not_support_is_skipped(tmp_path, monkeypatch):
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    pt = save_support_vectors(tmp_path, STEM, payload())
    assert load_support_vectors(pt).epoch == 3


# ---- changed, damaged and foreign files ----------------------------------------------------------------------

def rewrite_pt(pt, change, resign=False):
    """Change the saved payload and write it back (with a fresh checksum if ``resign``)."""
    saved = torch.load(pt, weights_only=True)
    change(saved)
    if resign:
        saved["sha256"] = content_sha256(saved)
    torch.save(saved, pt)


def test_a_pt_changed_after_saving_is_refused_with_or_without_its_json(tmp_path):
    pt = save_support_vectors(tmp_path, STEM, payload())
    rewrite_pt(pt, lambda saved: saved["alpha"].mul_(2))
    changed = (f"{pt} was changed after it was saved: the SHA-256 of its content is \\w+…, the file records \\w+…; "
               f"it differs from {STEM}.json at alpha_support. Do not use it")
    with pytest.raises(ArtifactCorruptError, match=changed) as caught:
        load_support_vectors(pt)
    assert "two runs" not in str(caught.value) and "does not belong" not in str(caught.value)
    pt.with_suffix(".json").unlink()
    with pytest.raises(ArtifactCorruptError, match=f"{pt} was changed after it was saved: .*records \\w+…. Do not"):
        load_support_vectors(pt)
    with pytest.raises(ArtifactCorruptError, match="was changed after it was saved"):
        reproduce(pt)


def test_a_json_changed_after_saving_names_the_key(tmp_path):
    pt = save_support_vectors(tmp_path, STEM, payload())
    summary = json.loads(pt.with_suffix(".json").read_text())
    summary["metrics"]["n_support"] = 3.0
    pt.with_suffix(".json").write_text(json.dumps(summary))
    with pytest.raises(ArtifactCorruptError, match=f"{STEM}.json differs from {pt} at metrics.n_support: the .json "
                                                   "was changed after it was saved; the .pt's own checksum verifies"):
        load_support_vectors(pt)


def test_files_of_format_2_load_with_a_warning(tmp_path):
    """Files saved before the checksum: the .pt without one, the .json with the SHA-256 of the .pt's bytes."""
    import hashlib

    old = {**payload(), "id": "a" * 32, "format_version": 2, "versions": {"lightning_nsv": "0.1", "torch": "2"}}
    pt = tmp_path / f"{STEM}.pt"
    torch.save(old, pt)
    with pytest.warns(UserWarning, match=f"{pt} was saved in result format 2, without a checksum"):
        assert load_support_vectors(pt).id == "a" * 32
    pt_sha256 = hashlib.sha256(pt.read_bytes()).hexdigest()
    pt.with_suffix(".json").write_text(json.dumps({"id": "a" * 32, "pt_sha256": pt_sha256}))
    with pytest.warns(UserWarning, match="without a checksum"):
        assert load_support_vectors(pt).outputs is None
    old["alpha"] = old["alpha"] * 2
    torch.save(old, pt)
    with pytest.warns(UserWarning), pytest.raises(ArtifactCorruptError, match="same id, other bytes"):
        load_support_vectors(pt)


def _assert_safe_message(error):
    assert not any(advice in str(error) for advice in UNSAFE_ADVICE), str(error)


@pytest.mark.parametrize("damage, message", [
    (lambda data: data[: len(data) // 2], r"is damaged or truncated \(\d+ bytes; its torch archive cannot be read"),
    (lambda data: data[:-30], r"is damaged or truncated"),
    (lambda data: b"", r"is empty \(0 bytes\): it is truncated"),
    (lambda data: np.random.default_rng(0).bytes(4096), r"is not a torch archive \(4096 bytes"),
], ids=["half", "end-cut", "empty", "random-bytes"])
def test_a_damaged_pt_is_named_with_what_to_do_and_never_an_unsafe_load(tmp_path, damage, message):
    pt = save_support_vectors(tmp_path, STEM, payload())
    pt.write_bytes(damage(pt.read_bytes()))
    with pytest.raises(ArtifactCorruptError, match=f"{pt} {message}.*restore the file from a copy or rerun") as caught:
        load_support_vectors(pt)
    _assert_safe_message(caught.value)


def test_a_pt_of_python_objects_is_not_a_result_and_no_unsafe_load_is_suggested(tmp_path):
    pt = tmp_path / f"{STEM}.pt"
    torch.save({"model": torch.nn.Linear(2, 1)}, pt)
    with pytest.raises(ArtifactCorruptError, match=f"{pt} holds Python objects other than tensors and plain values, "
                                                   "which a safe load refuses: it is not a support-vector") as caught:
        load_support_vectors(pt)
    _assert_safe_message(caught.value)


def test_a_damaged_json_is_named(tmp_path):
    pt = save_support_vectors(tmp_path, STEM, payload())
    summary = pt.with_suffix(".json")
    summary.write_text(summary.read_text()[:40])
    with pytest.raises(ArtifactCorruptError, match=f"{summary} is damaged \\(not valid JSON: .*line \\d+ column \\d+.*"
                                                   "remove the damaged .json to load the .pt alone"):
        load_support_vectors(pt)
    summary.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(ArtifactCorruptError, match="is damaged"):
        load_support_vectors(pt)
    summary.unlink()
    assert load_support_vectors(pt).epoch == 3  # the .pt alone, verified by its checksum


def test_a_json_without_its_pt_says_so(tmp_path):
    pt = save_support_vectors(tmp_path, STEM, payload())
    pt.unlink()
    with pytest.raises(FileNotFoundError, match=f"no support-vector result at {pt}: {STEM}.json is there without "
                                                "its .pt"):
        load_support_vectors(pt.with_suffix(".json"))


def test_a_pt_of_a_newer_format_asks_for_an_upgrade(tmp_path):
    pt = save_support_vectors(tmp_path, STEM, payload())
    newer = FORMAT_VERSION + 1
    rewrite_pt(pt, lambda saved: saved.update(format_version=newer), resign=True)
    with pytest.raises(ArtifactMismatchError, match=f"{pt} was written in result format {newer} by a newer "
                                                   f"lightning_nsv .*reads formats 2–{FORMAT_VERSION}: upgrade "):
        load_support_vectors(pt)


@pytest.mark.parametrize("change, message", [
    (lambda saved: saved.update(support=saved["support"].double()), r"'support' must be indices in \[0, 3\)"),
    (lambda saved: saved.update(support=torch.tensor([0, 5])), r"'support' must be indices in \[0, 3\)"),
    (lambda saved: saved.update(alpha=saved["alpha"][:2]), r"'alpha' has shape \(2,\), but there are 3 labels"),
    (lambda saved: saved.update(labels=[1.0, -1.0, 1.0]), "key 'labels' holds a list where Tensor is expected"),
    (lambda saved: saved.pop("module_state"), "key 'module_state' is missing"),
    (lambda saved: saved.update(epoch=True), "key 'epoch' holds a bool where int is expected"),
], ids=["float-support", "support-out-of-range", "short-alpha", "labels-list", "no-state", "bool-epoch"])
def test_a_pt_with_a_wrong_key_is_refused_by_name(tmp_path, change, message):
    pt = save_support_vectors(tmp_path, STEM, payload())
    pt.with_suffix(".json").unlink()
    rewrite_pt(pt, change, resign=True)  # a consistent file of a broken writer
    with pytest.raises(ArtifactMismatchError, match=f"{pt} is not a support-vector result: .*{message}"):
        load_support_vectors(pt)


def test_a_payload_missing_a_key_is_refused_before_anything_is_written(tmp_path):
    pt, before, previous = first_result(tmp_path)
    broken = payload(scale=2.0)
    del broken["metrics"]
    with pytest.raises(ValueError, match=f"cannot save {pt}, the payload is not a support-vector result: key "
                                         "'metrics' is missing"):
        save_support_vectors(tmp_path, STEM, broken)
    assert_previous_result(tmp_path, before, previous)


def test_a_payload_value_that_a_safe_load_cannot_read_is_refused_by_key(tmp_path):
    broken = payload()
    broken["solver"]["callback"] = {1, 2}
    with pytest.raises(TypeError, match=r"payload key payload\['solver'\]\['callback'\] holds a set, which a safe "
                                        r"load \(weights_only=True\) cannot read"):
        save_support_vectors(tmp_path, STEM, broken)
    assert files(tmp_path) == {}


def test_numpy_values_in_a_payload_are_saved_as_plain_values(tmp_path):
    values = payload()
    values["metrics"].update(n_support=np.float64(2.0), iterations=np.int64(7))
    values["solver"]["scale"] = np.array([1.5, 2.5])
    artifact = load_support_vectors(save_support_vectors(tmp_path, STEM, values))
    assert artifact.metrics["iterations"] == 7 and type(artifact.metrics["n_support"]) is float
    assert torch.equal(artifact.solver["scale"], torch.tensor([1.5, 2.5], dtype=torch.float64))


def test_a_view_of_a_large_tensor_saves_only_the_view(tmp_path):
    values = payload()
    big = torch.randn(1_000_000, dtype=torch.float64)
    values["alpha"] = big[10:13]  # contiguous, but its storage is 8 MB
    values["labels"] = torch.randn(3, 1000, dtype=torch.float64)[:, 0].sign()  # not contiguous
    pt = save_support_vectors(tmp_path, STEM, values)
    assert pt.stat().st_size < 50_000
    artifact = load_support_vectors(pt)
    assert torch.equal(artifact.alpha, big[10:13]) and torch.equal(artifact.labels, values["labels"])


def test_a_tensor_without_data_is_refused_by_key(tmp_path):
    values = payload()
    values["module_state"]["w"] = torch.empty(4, device="meta")
    with pytest.raises(ValueError, match=r"payload key payload\['module_state'\]\['w'\] is a tensor without data"):
        save_support_vectors(tmp_path, STEM, values)
    assert files(tmp_path) == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_saved_for_a_cpu_load(tmp_path):
    values = payload()
    values["alpha"], values["module_state"]["w"] = values["alpha"].cuda(), values["module_state"]["w"].cuda()
    pt = save_support_vectors(tmp_path, STEM, values)
    raw = torch.load(pt, weights_only=True)  # no map_location: every tensor is on the CPU already
    assert raw["alpha"].device.type == "cpu" and raw["module_state"]["w"].device.type == "cpu"
    assert torch.equal(load_support_vectors(pt).alpha, payload()["alpha"])


def test_a_folder_where_the_pt_goes_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / f"{STEM}.pt").mkdir()
    with pytest.raises(IsADirectoryError, match=f"{tmp_path / STEM}.pt is a folder, so no file can be saved under "
                                                "that name: remove or rename the folder"):
        save_support_vectors(tmp_path, STEM, payload())
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{STEM}.pt"]
    with pytest.raises(ArtifactMismatchError, match="is a folder, not a support-vector result file"):
        load_support_vectors(tmp_path / f"{STEM}.pt")


def test_a_save_folder_that_is_a_file_is_named(tmp_path):
    (tmp_path / "nsv").write_text("a log, not a folder")
    with pytest.raises(NotADirectoryError, match=f"{tmp_path / 'nsv'} is a file, not a folder: choose another "
                                                 "folder to save into"):
        save_support_vectors(tmp_path / "nsv", STEM, payload())
    assert (tmp_path / "nsv").read_text() == "a log, not a folder"


def test_a_folder_without_write_permission_is_named_and_keeps_the_previous_result(tmp_path, monkeypatch):
    pt, before, previous = first_result(tmp_path)

    def refused(*args, **kwargs):  # what mkstemp meets in a read-only folder (the tests may run as root)
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(atomic.tempfile, "mkstemp", refused)
    with pytest.raises(PermissionError, match=f"{pt}: creating a temporary file in {tmp_path} failed: Permission "
                                              "denied; make the folder writable or pass another save_dir"):
        save_support_vectors(tmp_path, STEM, payload(scale=2.0))
    monkeypatch.undo()
    assert_previous_result(tmp_path, before, previous)


def test_a_folder_removed_during_the_save_is_named_and_nothing_is_left(tmp_path, monkeypatch):
    import shutil

    directory = tmp_path / "nsv"
    pt, _, _ = first_result(directory)

    class RemovedFolder(FaultyOs):
        def __getattr__(self, name):
            if name == "link":  # another process removes the run's folder while the temporaries are written
                shutil.rmtree(directory, ignore_errors=True)
            return getattr(os, name)

    monkeypatch.setattr(atomic, "os", RemovedFolder())
    with pytest.raises(FileNotFoundError, match=f"could not save the support-vector result {pt}: keeping the "
                                                f"previous version of {pt.with_suffix('.json')} failed: No such file "
                                                f"or directory. The folder {directory} is gone"):
        save_support_vectors(directory, STEM, payload(scale=2.0))
    monkeypatch.setattr(atomic, "os", os)
    assert not directory.exists()


def test_stems_with_dots_load_by_their_stem_and_stems_with_folders_are_refused(tmp_path):
    pt = save_support_vectors(tmp_path, "run.v2", payload())
    assert pt.name == "run.v2.pt" and load_support_vectors(tmp_path / "run.v2").path == pt
    for bad in ("../escape", "a/b", "", "x.pt"):
        with pytest.raises(ValueError, match="`stem` must be a file name without folder and suffix"):
            save_support_vectors(tmp_path, bad, payload())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.v2.json", "run.v2.pt"]


def test_concurrent_saves_and_loads_of_one_result_never_mix_two_saves(tmp_path):
    save_support_vectors(tmp_path, STEM, payload())
    errors = []

    def save(scale):
        try:
            for _ in range(15):
                save_support_vectors(tmp_path, STEM, payload(scale=scale))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    writers = [threading.Thread(target=save, args=(scale,)) for scale in (2.0, 3.0)]
    for writer in writers:
        writer.start()
    while any(w.is_alive() for w in writers):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no interrupted-save fallback either: loads wait for a save
            artifact = load_support_vectors(tmp_path / STEM)
        assert float(artifact.alpha[0]) in (0.5, 1.0, 1.5)
    for writer in writers:
        writer.join()
    assert not errors
    assert sorted(files(tmp_path)) == [f"{STEM}.json", f"{STEM}.pt"]
    summary = json.loads((tmp_path / f"{STEM}.json").read_text())
    assert summary["id"] == load_support_vectors(tmp_path / STEM).id


# ---- reproduce() and the saved network outputs ---------------------------------------------------------------

@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """A small MLP trained (plain torch) to zero error on 8×8 digits, analysed and saved as the callback does."""
    from lightning_nsv.analysis import network_support_vectors
    from lightning_nsv.artifacts import class_path, plain
    from lightning_nsv.datamodules import DigitsDataModule
    from lightning_nsv.extract import find_path_part
    from lightning_nsv.models import LeakyReLUMLP

    torch.manual_seed(0)
    data = DigitsDataModule(m=120, seed=0)
    data.setup("fit")
    model = LeakyReLUMLP(widths=[32], beta=0.0)
    x, y = data.train_dataset.tensors
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(400):
        optimiser.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(model(x), y.float()).backward()
        optimiser.step()
    path = find_path_part(model, None, None)
    net = path.path_network()
    with torch.no_grad():
        x_train = path.embed(x)
    analysis = network_support_vectors(net, x_train, y)
    values = {
        "support": torch.from_numpy(analysis.svm.support_), "alpha": torch.from_numpy(analysis.svm.alpha_),
        "intercept": 0.0, "labels": torch.where(y > 0, 1.0, -1.0).to(torch.float64), "num_outputs": 1,
        "network": {"weights": list(net.weights), "biases": list(net.biases), "betas": list(net.betas),
                    "gammas": list(net.gammas)},
        "path_part": path.name, "path_module": None, "embedding": None, "module_class": class_path(model),
        "module_hparams": plain(dict(model.hparams)), "module_state": model.state_dict(),
        "data_class": class_path(data), "data_hparams": plain(dict(data.hparams)),
        "train_indices": data.train_indices, "epoch": 0, "global_step": 400,
        "solver": {"intercept": False, "C": 1e7, "kernel": "auto", "max_dense_bytes": 1 << 30, "multiclass": "joint"},
        "metrics": analysis.to_metrics(), "outputs": network_outputs(net, x_train),
    }
    return load_support_vectors(save_support_vectors(tmp_path_factory.mktemp("nsv"), STEM, values))


def test_reproduce_checks_the_outputs_and_refits_the_same_support(analysed):
    assert analysed.outputs["values"].shape == (120,)
    again = reproduce(analysed)
    assert torch.equal(torch.from_numpy(again.svm.support_), analysed.support)


def test_reproduce_refuses_a_network_whose_weights_differ_and_names_the_largest_difference(analysed):
    changed = {k: v * 1.01 if k.endswith("weight") else v for k, v in analysed.module_state.items()}
    with pytest.raises(ArtifactMismatchError, match=r"the rebuilt network computes other outputs than the analysed "
                                                    r"one in .*: largest difference [\d.e-]+ at training sample \d+ "
                                                    r"\(saved \[.*\], now \[.*\]\), tolerance [\d.e-]+ "
                                                    r"\(output_rtol=1e-06\)"):
        reproduce(dataclasses.replace(analysed, module_state=changed))


def test_reproduce_refuses_a_module_that_computes_otherwise_with_the_same_weights(analysed):
    from lightning_nsv.models import LeakyReLUMLP

    leaky = LeakyReLUMLP(widths=[32], beta=0.2)  # same state dict, another activation
    with pytest.raises(ArtifactMismatchError, match="computes other outputs"):
        reproduce(analysed, module=leaky)


def test_the_output_check_of_a_k_class_network_states_its_tolerance():
    from types import SimpleNamespace

    from lightning_nsv.artifacts.rebuild import compare_outputs
    from lightning_nsv.scope import HeadScope

    def _check_outputs(saved, net, x, rtol):  # as reproduce() compares a head's outputs
        compare_outputs(saved, x, lambda rows: HeadScope.saved_outputs(None, net, rows), rtol)

    torch.manual_seed(0)
    weights = [torch.randn(6, 4, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64)]
    net = PathNetwork.from_tensors(weights, None, [0.1], [1.0])
    x = torch.randn(50, 4)
    saved = SimpleNamespace(outputs=network_outputs(net, x, max_samples=20), m=50, path="nsv/result.pt")
    assert saved.outputs["values"].shape == (20, 3) and saved.outputs["indices"][-1] == 49
    rounded = PathNetwork.from_tensors([w * (1 + 1e-9) for w in weights], None, [0.1], [1.0])
    _check_outputs(saved, rounded, x, rtol=1e-6)  # rounding passes
    changed = PathNetwork.from_tensors([weights[0], weights[1] * (1 + 1e-4)], None, [0.1], [1.0])
    with pytest.raises(ArtifactMismatchError, match=r"largest difference [\d.e-]+ at training sample \d+ \(saved "
                                                    r"\[[^]]+, [^]]+, [^]]+\], now .*\(output_rtol=1e-06\)"):
        _check_outputs(saved, changed, x, rtol=1e-6)
    _check_outputs(saved, changed, x, rtol=1e-2)  # a looser tolerance, as for TF32 on a GPU


def test_a_single_file_write_on_a_full_disk_names_the_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    """The writer of figures and text files (lightning_nsv.atomic.write_text, torch_save, save_figure)."""
    target = tmp_path / "report.md"
    atomic.write_text(target, "previous")

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match=f"writing {target} failed: No space left on device") as caught:
        atomic.write_text(target, "next")
    monkeypatch.undo()
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert files(tmp_path) == {"report.md": b"previous"}


def test_reproduce_of_a_file_without_outputs_warns(analysed, monkeypatch):
    import lightning_nsv.scope.head as binary  # where reproduce() finds it, through the head's scope

    monkeypatch.setattr(binary, "network_support_vectors", lambda *args, **kwargs: "refitted")
    with pytest.warns(UserWarning, match="holds no network outputs \\(saved before format 3\\): nothing shows"):
        assert reproduce(dataclasses.replace(analysed, outputs=None)) == "refitted"
