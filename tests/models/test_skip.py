"""SkipNetwork: Ψ against forward hooks, the unit draw, checkpoints, frozen U in skip_rand, error messages."""
import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_nsv.compat import pl
from lightning_nsv.models.layers import mlp_sequential
from lightning_nsv.models.skip import SkipNetwork, activation_name


def _data(n=24, shape=(1, 4, 4), k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, *shape, generator=g), torch.randint(k, (n,), generator=g)


def _conv_net():
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.Tanh()),
        nn.Conv2d(3, 2, 3), nn.Softplus(), nn.Flatten(),
        nn.Linear(2 * 2 * 2, 5), nn.Sigmoid(), nn.Linear(5, 3),
    )


def _direct_psi(model, x):
    """Ψ in float64 from forward hooks on a copy of every hidden module: each output, indexed by the unit table."""
    trunk, outputs = copy.deepcopy(model.trunk).double(), {}
    for i, m in enumerate(trunk):
        m.register_forward_hook(lambda mod, inp, out, i=i: outputs.__setitem__(i, out))
    with torch.no_grad():
        trunk(x.double())
    return torch.stack([outputs[pos][:, c, h, w] if outputs[pos].dim() == 4 else outputs[pos][:, c]
                        for pos, c, h, w in model.unit_table.tolist()], 1)


@pytest.mark.parametrize("kind", ["mlp", "conv"])
def test_psi_matches_forward_hooks(kind):
    x, _ = _data()
    if kind == "mlp":
        model = SkipNetwork.mlp(16, [6, 5, 4], 3, "sigmoid", num_skip_units=9, skip_seed=1)
    else:
        model = SkipNetwork(_conv_net(), input_shape=(1, 4, 4), num_skip_units=30, skip_seed=2)
    psi = model.psi(x)
    assert psi.dtype == torch.float64 and psi.shape == (24, model.num_units)
    torch.testing.assert_close(psi, _direct_psi(model, x), rtol=1e-12, atol=0)
    torch.testing.assert_close(model.features(x), psi.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model(x), model.head(psi.float()), rtol=1e-5, atol=1e-5)
    assert model.unit_table.shape == (model.num_units, 4)


def test_original_mode_is_the_given_network():
    seq = mlp_sequential(16, [6, 5], 3, activation="tanh")
    x, _ = _data()
    model = SkipNetwork(seq, mode="original")
    assert model.head is seq[-1] and model.num_units == 5 and len(model.skip_units) == 0
    torch.testing.assert_close(model(x), seq(x))
    torch.testing.assert_close(model.psi(x), seq[:-1](x).double(), rtol=1e-6, atol=1e-7)
    V, b = model.output_weights()
    assert V.shape == (5, 3) and b is seq[-1].bias
    assert SkipNetwork(seq, mode="skip_sgd").output_weights()[1] is None  # G = Ψ V: no output bias


def test_unit_draw_is_seeded_and_spread_over_lower_layers():
    a = SkipNetwork.mlp(16, [8, 8, 8, 8], 3, num_skip_units=20, skip_seed=5)
    b = SkipNetwork.mlp(16, [8, 8, 8, 8], 3, num_skip_units=20, skip_seed=5)
    c = SkipNetwork.mlp(16, [8, 8, 8, 8], 3, num_skip_units=20, skip_seed=6)
    assert torch.equal(a.skip_units, b.skip_units) and not torch.equal(a.skip_units, c.skip_units)
    units = a.skip_units
    assert set(units[:, 0].tolist()) <= {2, 4, 6}  # activations below the last one
    assert len({tuple(u) for u in units.tolist()}) == 20 and (units[:, 2:] == 0).all()
    assert a.num_units == 8 + 20 and a.activations == ("sigmoid",) * 4
    everything = SkipNetwork.mlp(16, [8, 8, 8, 8], 3, num_skip_units=24)
    assert sorted(map(tuple, everything.skip_units.tolist())) == [(p, j, 0, 0) for p in (2, 4, 6) for j in range(8)]


def test_wraps_the_package_conv_fc_network():
    from lightning_nsv.models.conv_fc import ConvFCNet

    net = ConvFCNet(in_channels=1, image_size=4, fc_depth=1, fc_width=6, conv_channels=2, num_classes=3)
    model = SkipNetwork(net, num_skip_units=20, skip_seed=0)  # input shape from the ConvFCNet's hyperparameters
    assert model.input_shape == (1, 4, 4) and model.num_units == 26
    assert set(model.skip_units[:, 0].tolist()) <= {1, 4, 7}  # the three conv activations (feature-map units)
    x, _ = _data()
    torch.testing.assert_close(model.psi(x), _direct_psi(model, x), rtol=1e-12, atol=0)


def test_conv_units_are_channel_h_w():
    model = SkipNetwork(_conv_net(), input_shape=(1, 4, 4), num_skip_units=54, skip_seed=0)  # all 3*4*4 + 2*2*2 - 2
    assert model.activations == ("tanh", "softplus", "sigmoid")
    layer0 = model.skip_units[model.skip_units[:, 0] == 1]
    assert layer0[:, 1].max() <= 2 and layer0[:, 2].max() <= 3 and layer0[:, 3].max() <= 3
    assert len(layer0) + len(model.skip_units[model.skip_units[:, 0] == 3]) == 54


@pytest.mark.parametrize("name", ["sigmoid", "softplus", "tanh", "relu", "leaky_relu"])
def test_activations(name):
    model = SkipNetwork.mlp(16, [4, 4], 3, name, num_skip_units=2)
    assert model.activations == (name, name)
    x, y = _data()
    assert torch.isfinite(nn.functional.cross_entropy(model(x), y))
    assert activation_name(nn.ReLU()) == "relu" and activation_name(nn.LeakyReLU()) == "leaky_relu"
    assert activation_name(nn.Linear(2, 2)) is None


def test_iter_psi_columns_loaders_and_no_side_effects():
    x, y = _data()
    model = SkipNetwork.mlp(16, [6, 5, 4], 3, num_skip_units=9)
    model.train()
    psi = model.psi(x, batch_size=5)
    loader = DataLoader(TensorDataset(x, y), batch_size=7)
    torch.testing.assert_close(model.psi(loader), psi, rtol=1e-12, atol=1e-15)  # BLAS rounds per batch size
    torch.testing.assert_close(torch.cat(list(model.iter_psi(loader, slice(3, 8)))), model.psi(loader)[:, 3:8],
                               rtol=0, atol=0)
    assert model.training and next(model.parameters()).dtype == torch.float32
    with pytest.raises(TypeError, match="expected batches `x` or `\\(x, y, ...\\)` of tensors, got a batch of dict"):
        model.psi([{"x": x}])


def _fit(model, x, y, tmp_path, batch_size=8, **trainer_kwargs):
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, **{"enable_checkpointing": False, **trainer_kwargs})
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=batch_size))
    return trainer


def test_checkpoint_restores_unit_subset(tmp_path):
    x, y = _data()
    model = SkipNetwork.mlp(16, [6, 6, 6], 3, num_skip_units=7, skip_seed=11)
    trainer = _fit(model, x, y, tmp_path, enable_checkpointing=True)
    path = trainer.checkpoint_callback.best_model_path
    other_seed = SkipNetwork.mlp(16, [6, 6, 6], 3, num_skip_units=7, skip_seed=99).skip_units
    assert not torch.equal(other_seed, model.skip_units)
    loaded = SkipNetwork.load_from_checkpoint(path, skip_seed=99)  # would draw another subset; the checkpoint wins
    assert torch.equal(loaded.skip_units, model.skip_units)
    torch.testing.assert_close(loaded.psi(x), model.psi(x), rtol=0, atol=0)
    torch.testing.assert_close(loaded.eval()(x), model.eval()(x))
    user_net = mlp_sequential(16, [6, 6, 6], 3, activation="softplus")
    from_user = SkipNetwork(user_net, num_skip_units=4, skip_seed=3)
    trainer = _fit(from_user, x, y, tmp_path / "user", enable_checkpointing=True)
    again = SkipNetwork.load_from_checkpoint(trainer.checkpoint_callback.best_model_path,
                                             net=mlp_sequential(16, [6, 6, 6], 3, activation="softplus"))
    assert torch.equal(again.skip_units, from_user.skip_units)
    torch.testing.assert_close(again.psi(x), from_user.psi(x), rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["skip_rand", "skip_sgd"])
def test_skip_rand_freezes_u(mode, tmp_path):
    x, y = _data()
    model = SkipNetwork.mlp(16, [6, 6], 3, num_skip_units=5, mode=mode, lr=0.5)
    u0 = {k: v.clone() for k, v in model.trunk.state_dict().items()}
    v0 = model.head.weight.detach().clone()
    _fit(model, x, y, tmp_path)
    u_same = all(torch.equal(u0[k], v) for k, v in model.trunk.state_dict().items())
    assert u_same == (mode == "skip_rand")
    assert not torch.equal(v0, model.head.weight)
    model.train()
    assert model.head.training and model.trunk.training == (mode == "skip_sgd")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == ({"head.weight"} if mode == "skip_rand" else {n for n, _ in model.named_parameters()})


def test_lbfgs_full_batch_fits_skip_rand(tmp_path):
    x, y = _data(n=12)
    model = SkipNetwork.mlp(16, [8, 8], 3, "softplus", num_skip_units=8, mode="skip_rand", optimizer="lbfgs", lr=1.0)
    before = nn.functional.cross_entropy(model(x), y).item()
    _fit(model, x, y, tmp_path, batch_size=12)
    assert nn.functional.cross_entropy(model(x), y).item() < before / 2


def test_error_messages():
    seq = mlp_sequential(16, [4, 4], 3)
    with pytest.raises(ValueError, match="`mode` can be original, skip_sgd, skip_rand, got 'skip'"):
        SkipNetwork(seq, mode="skip")
    with pytest.raises(ValueError, match="`optimizer` can be sgd, adam, lbfgs, got 'rmsprop'"):
        SkipNetwork(seq, optimizer="rmsprop")
    with pytest.raises(ValueError, match="need lr > 0, momentum >= 0, weight_decay >= 0, got 0, 0.9, 0.0"):
        SkipNetwork(seq, lr=0)
    with pytest.raises(ValueError, match="optimizer 'lbfgs' has no weight decay, got weight_decay=0.1"):
        SkipNetwork(seq, optimizer="lbfgs", weight_decay=0.1)
    with pytest.raises(ValueError, match="0 in mode 'original' .* got 3 in mode 'original'; choose mode 'skip_sgd'"):
        SkipNetwork(seq, num_skip_units=3, mode="original")
    with pytest.raises(ValueError, match=r"at most the 4 units of the hidden layers below the last one \(\{2: 4\} by "
                                         r"position\), got 5"):
        SkipNetwork(seq, num_skip_units=5)
    with pytest.raises(TypeError, match="`net` must be an nn.Sequential, .* got Linear"):
        SkipNetwork(nn.Linear(3, 3))
    with pytest.raises(ValueError, match="the last module of `net` must be the nn.Linear output layer with K >= 2"):
        SkipNetwork(nn.Sequential(nn.Linear(3, 4), nn.Sigmoid()))
    with pytest.raises(ValueError, match="K >= 2 outputs"):
        SkipNetwork(mlp_sequential(16, [4], 1))
    with pytest.raises(ValueError, match="`net` has no hidden layer"):
        SkipNetwork(nn.Sequential(nn.Linear(3, 4)))
    with pytest.raises(ValueError, match=r"cannot infer the input shape of `net` \(its first layer is Conv2d\); "
                                         r"pass input_shape="):
        SkipNetwork(_conv_net())
    with pytest.raises(ValueError, match=r"`hidden_layers` must be positions in 0..5 \(below the last hidden layer at "
                                         r"6\) of the flattened modules, got \[6\]"):
        SkipNetwork(mlp_sequential(16, [4, 4, 4], 3), hidden_layers=[6])
    wrapped = type("Wrapped", (nn.Module,), {})()
    wrapped.net = seq
    assert SkipNetwork(wrapped, num_skip_units=2).num_units == 6  # a module holding `.net` is accepted


def test_units_are_gathered_without_concatenating_all_activations(monkeypatch):
    model = SkipNetwork.mlp(16, [50] * 4, 3, num_skip_units=5)
    x, _ = _data()
    widths, cat = [], torch.cat
    monkeypatch.setattr(torch, "cat", lambda ts, dim=0: widths.append(sum(t.shape[-1] for t in ts)) or cat(ts, dim=dim))
    model(x)
    assert widths == [model.num_units] == [55]  # the last layer and the 5 chosen units, not all 200 hidden units
