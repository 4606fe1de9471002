"""TensorBoard dashboards: the custom-scalars layout, scalars against the epoch, the Text tab's verdicts, HParams
and the summary card."""
import math
import re
import warnings

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from torch.utils.data import DataLoader, TensorDataset

from lightning_nsv.callbacks import dashboard
from lightning_nsv.callbacks.loss_valley import LossValleyMonitor
from lightning_nsv.callbacks.psi_rank import PsiRankMonitor
from lightning_nsv.compat import pl
from lightning_nsv.datamodules import DigitsDataModule
from lightning_nsv.models import LeakyReLUMLP
from lightning_nsv.models.skip import SkipNetwork
from lightning_nsv.plotting import plot_summary_card, summary_verdict


def _events(log_dir) -> EventAccumulator:
    return EventAccumulator(str(log_dir), size_guidance={"tensors": 0, "scalars": 0}).Reload()


def _skip_fit(tmp_path, skip_units: int, max_epochs: int = 2):
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(20, 1, 4, 4, generator=g), torch.randint(3, (20,), generator=g)
    model = SkipNetwork.mlp(16, [8, 8, 8], 3, "softplus", num_skip_units=skip_units, skip_seed=0, lr=0.05)
    callbacks = [PsiRankMonitor(log_figure=False), LossValleyMonitor(surface_points=0, log_figure=False)]
    logger = pl.loggers.TensorBoardLogger(tmp_path, name="tb", default_hp_metric=False)
    trainer = pl.Trainer(max_epochs=max_epochs, logger=logger,
                         callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, log_every_n_steps=1)
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=10))
    return trainer, _events(trainer.logger.log_dir)


def _layout(events: EventAccumulator) -> layout_pb2.Layout:
    (point,) = events.Tensors("custom_scalars__config__")
    return layout_pb2.Layout.FromString(point.tensor_proto.string_val[0])


@pytest.fixture(scope="module")
def singular(tmp_path_factory):
    """M = 12 skip-network units for N = 20 samples: rank Ψ < N, the escape path does not apply."""
    return _skip_fit(tmp_path_factory.mktemp("singular"), skip_units=4)


def test_layout_charts_name_logged_tags(singular):
    trainer, events = singular
    layout, scalars = _layout(events), events.Tags()["scalars"]
    assert [c.title for c in layout.category] == ["Ψ", "valley"]
    for category in layout.category:
        for chart in category.chart:
            for regex in chart.multiline.tag:
                assert any(re.match(regex, tag) for tag in scalars), (chart.title, regex)
    rank_chart = next(c for c in layout.category[0].chart if c.title.startswith("rank of Ψ"))
    assert [t for t in scalars if any(re.match(r, t) for r in rank_chart.multiline.tag)] == ["psi/rank",
                                                                                          "psi/num_samples"]


def test_quantities_that_span_decades_are_charted_as_log10_and_each_verdict_on_its_own_chart(singular):
    _, events = singular
    layout = _layout(events)
    for plain, logged in (("psi/sigma_min", "psi/log10_sigma_min"), ("psi/condition_number",
                                                                     "psi/log10_condition_number"),
                          ("valley/escape_residual", "valley/log10_escape_residual")):
        values = [e.value for e in events.Scalars(plain)]
        assert [e.value for e in events.Scalars(logged)] == pytest.approx([math.log10(v) for v in values], rel=1e-6)
    charted = [(chart.title, list(chart.multiline.tag)) for category in layout.category for chart in category.chart]
    linear = {*dashboard._tags("psi/", "sigma_min", "condition_number"), *dashboard._tags("valley/", "escape_residual")}
    assert not any(linear & set(tags) for _, tags in charted)  # the log10 series instead
    verdicts = {"psi/full_rank", "valley/lemma21_certified", "valley/per_sample_certified", "valley/escape_applies",
                "valley/escape_in_sublevel_set", "valley/assumption31_satisfied", "valley/cross_entropy_model"}
    for tag in verdicts:
        (title, tags), = [(title, tags) for title, tags in charted if any(re.match(t, tag) for t in tags)]
        assert len(tags) == 1 and title.endswith("(0/1; read with Smoothing 0)"), title
    singular_psi = {"sigma_min": 0.0, "condition_number": math.inf, "rank": 3.0}  # no log10 point at this epoch
    assert dashboard.with_log10(singular_psi, dashboard.PSI_LOG_SCALE) == singular_psi


@pytest.mark.filterwarnings("ignore:LossValleyMonitor.:UserWarning")
def test_scalars_are_logged_once_per_analysis_against_the_epoch(singular):
    trainer, events = singular
    assert [e.step for e in events.Scalars("psi/rank")] == [0, 1]
    assert [e.step for e in events.Scalars("valley/mean_loss")] == [0, 1]
    assert float(trainer.callback_metrics["psi/rank"]) == events.Scalars("psi/rank")[-1].value


def _text(events: EventAccumulator, tag: str) -> str:
    return events.Tensors(f"{tag}/text_summary")[-1].tensor_proto.string_val[0].decode()


def test_text_tab_has_the_psi_and_valley_verdicts(singular):
    trainer, events = singular
    psi = _text(events, "psi/report")
    assert "PsiRankMonitor at epoch 1" in psi and "rank 12 < N" in psi and "does not hold" in psi
    valley = _text(events, "valley/report")
    assert "escape path (Theorem 3.4): does not apply" in valley and "is not logged" in valley
    assert "Lemma 2.1" in valley and "Assumption 3.1" in valley


def test_escape_target_norm_is_logged_only_where_the_certificate_applies(singular, tmp_path):
    trainer, events = singular
    assert "valley/escape_target_norm" not in events.Tags()["scalars"]
    assert "valley/escape_target_norm" not in trainer.callback_metrics
    assert events.Scalars("valley/escape_applies")[-1].value == 0.0
    trainer, events = _skip_fit(tmp_path, skip_units=16, max_epochs=1)  # M = 24 >= N = 20: rank N
    assert events.Scalars("valley/escape_applies")[-1].value == 1.0
    assert "valley/escape_target_norm" in events.Tags()["scalars"]
    assert "is not logged" not in _text(events, "valley/report")


def test_layout_is_written_once_per_writer(tmp_path):
    class Charts(pl.Callback):
        def dashboard_charts(self):
            return dashboard.psi_charts("psi/")

    logger = pl.loggers.TensorBoardLogger(tmp_path, name="tb")
    trainer = pl.Trainer(logger=logger, callbacks=[Charts()], enable_progress_bar=False)
    dashboard.write_layout(trainer)
    dashboard.write_layout(trainer)
    logger.experiment.flush()
    assert len(_events(logger.log_dir).Tensors("custom_scalars__config__")) == 1


def _experiment(log_dir) -> HParamsPluginData:
    events = EventAccumulator(str(log_dir)).Reload()
    content = events.SummaryMetadata("_hparams_/experiment").plugin_data.content
    return HParamsPluginData.FromString(content).experiment


def test_hparams_list_the_metrics_in_order_and_the_non_default_hyperparameters(tmp_path):
    logger = pl.loggers.TensorBoardLogger(tmp_path, name="tb", default_hp_metric=False)
    trainer = pl.Trainer(logger=logger, enable_progress_bar=False)
    model, data = LeakyReLUMLP(widths=[4], lr=0.1), DigitsDataModule(m=300)
    tags = ["nsv/n_support", "nsv/support_fraction", "nsv/margin_ratio"]
    assert dashboard.register_hparams(trainer, {"model": model, "data": data}, tags)
    assert not dashboard.register_hparams(trainer, {"model": model, "data": data}, tags)  # one session per run
    logger.experiment.flush()
    experiment = _experiment(logger.log_dir)
    assert [m.name.tag for m in experiment.metric_infos] == tags
    assert {h.name for h in experiment.hparam_infos} == {"model/widths", "model/lr", "data/m"}  # not defaults
    events = EventAccumulator(str(logger.log_dir)).Reload()
    content = events.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    recorded = HParamsPluginData.FromString(content).session_start_info.hparams
    assert "data/batch_size" in recorded and "model/init_std" not in recorded  # all that are set, None left out


def test_skip_monitors_register_their_headline_metrics_first(singular):
    trainer, _ = singular
    tags = [m.name.tag for m in _experiment(trainer.logger.log_dir).metric_infos]
    assert tags[:6] == ["psi/rank", "psi/full_rank", "psi/sigma_min", "valley/lemma21_certified",
                        "valley/escape_applies", "valley/assumption31_satisfied"]
    assert "psi/condition_number" in tags and "valley/escape_target_norm" not in tags


def test_a_logger_with_its_own_hparams_session_is_told_to_leave_it_out(tmp_path):
    logger = pl.loggers.TensorBoardLogger(tmp_path, name="tb")  # default_hp_metric=True
    trainer = pl.Trainer(logger=logger, enable_progress_bar=False)
    model = LeakyReLUMLP(widths=[4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing logged yet: nothing to say
        dashboard.register_hparams(trainer, {"model": model}, ["nsv/n_support"])
    logger = pl.loggers.TensorBoardLogger(tmp_path, name="tb")
    logger.log_hyperparams(dict(model.hparams))  # what Lightning does at the start of fit: an hp_metric session
    trainer = pl.Trainer(logger=logger, enable_progress_bar=False)
    with pytest.warns(UserWarning, match="default_hp_metric=False"):
        dashboard.register_hparams(trainer, {"model": model}, ["nsv/n_support"])


def test_select_hparams_takes_the_keys_given_and_refuses_unknown_ones():
    sources = {"model": LeakyReLUMLP(widths=[4]), "data": DigitsDataModule(m=None)}
    params, flagged = dashboard.select_hparams(sources, keys=["data/batch_size"])
    assert flagged == ["data/batch_size"] and "data/m" not in params and params["model/widths"] == "[4]"
    with pytest.raises(ValueError, match=r"hparams \['data/m'\] are not among.*None values"):
        dashboard.select_hparams(sources, keys=["data/m"])


def test_hparams_metrics_put_the_callbacks_headlines_first(tmp_path):
    trainer = pl.Trainer(logger=False, callbacks=[PsiRankMonitor(), LossValleyMonitor()])
    tags = dashboard.hparams_metrics(trainer, ["valley/mean_loss", "psi/rank"])
    assert tags == ["psi/rank", "psi/full_rank", "psi/sigma_min", "valley/lemma21_certified",
                    "valley/escape_applies", "valley/assumption31_satisfied", "valley/mean_loss"]


def _card_texts(metrics) -> list[str]:
    fig, ax = plot_summary_card(metrics, epoch=3)
    return [t.get_text() for t in ax.texts]


def test_summary_card_marks_a_vacuous_bound():
    metrics = {"n_support": 20.0, "support_fraction": 0.1, "margin_ratio": 0.8, "cosine_wbar_v": 0.9,
               "kkt_residual": 1e-12, "compression_bound": 3.5}
    texts = _card_texts(metrics)
    assert "s = 20 of 200 (10.0%)" in texts and summary_verdict(metrics) == "s = 20 of 200 (10.0%)"
    assert "vacuous (> 1)" in texts and "solved" in texts and "—" in texts  # no validation: no agreement
    texts = _card_texts({**metrics, "compression_bound": 0.4, "kkt_residual": 1e-3})
    assert "vacuous (> 1)" not in texts and "test-error bound" in texts and "not solved!" in texts


def test_summary_card_shows_significant_digits_and_the_scope():
    """A margin ratio of 2.4e-9 and a cosine of 9e-8 (a whole CIFAR network) read 0.000 with three decimals."""
    metrics = {"n_support": 495.0, "support_fraction": 0.99, "margin_ratio": 2.4e-9, "cosine_wbar_v": 9e-8,
               "val_agreement": 1.0, "kkt_residual": 1e-12, "compression_bound": 3e5}
    fig, ax = plot_summary_card(metrics, epoch=26, scope="whole network")
    texts = [t.get_text() for t in ax.texts]
    assert "network support vectors of the whole network, epoch 26" in texts
    assert {"2.4e-09", "9e-08", "0.99", "1"} <= set(texts) and "0.000" not in texts


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A digits MLP trained past zero training error, analysed every 2 epochs."""
    from lightning_nsv.callbacks import NetworkSupportVectors

    pl.seed_everything(0)
    callback = NetworkSupportVectors(stop_on_zero_error=False, every_n_epochs=2)
    logger = pl.loggers.TensorBoardLogger(tmp_path_factory.mktemp("tracked"), name="tb", default_hp_metric=False)
    trainer = pl.Trainer(max_epochs=32, logger=logger, callbacks=[callback], enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(LeakyReLUMLP(widths=[32, 32], optimizer="adam", lr=0.01),
                datamodule=DigitsDataModule(m=200, seed=0, batch_size=50))
    assert len(callback.history) >= 2
    events = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0, "scalars": 0, "images": 0}).Reload()
    return trainer, callback, events


def test_nsv_metrics_draw_one_point_per_analysis_against_the_epoch(tracked):
    trainer, callback, events = tracked
    epochs = [int(h["epoch"]) for h in callback.history]
    for tag in ("nsv/n_support", "nsv/margin_ratio", "nsv/zero_error_reached"):
        assert [e.step for e in events.Scalars(tag)] == epochs, tag  # no second dot at the global step
    assert [e.value for e in events.Scalars("nsv/n_support")] == [h["n_support"] for h in callback.history]
    assert float(trainer.callback_metrics["nsv/n_support"]) == callback.history[-1]["n_support"]


def test_nsv_layout_summary_card_and_hparams(tracked):
    trainer, callback, events = tracked
    (category,) = _layout(events).category
    assert category.title == "support vectors"
    scalars = events.Tags()["scalars"]
    charted = {t for chart in category.chart for r in chart.multiline.tag for t in scalars if re.match(r, t)}
    assert {f"nsv/{k}" for k in dashboard.HEADLINE} | {"nsv/support_jaccard_previous"} <= charted
    for chart in category.chart:  # a binary head: no chart of s per class, which would stay empty
        assert any(re.match(r, t) for r in chart.multiline.tag for t in scalars), chart.title
    assert len(events.Images("nsv/summary")) == len(callback.history)  # a card at each analysis
    tags = [m.name.tag for m in _experiment(trainer.logger.log_dir).metric_infos]
    assert tags[:7] == [f"nsv/{k}" for k in dashboard.HEADLINE] and "nsv/svm_margin" in tags


def test_chart_regexes_are_anchored():
    _, charts = dashboard.nsv_charts("nsv/", per_class=True)
    (per_class,) = charts["s per class"][1]
    assert re.match(per_class, "nsv/n_support_class3") and not re.match(per_class, "nsv/n_support")
    (s,) = charts["s: network support vectors"][1]
    assert re.match(s, "nsv/n_support") and not re.match(s, "nsv/n_support_class0")
    assert "s per class" not in dashboard.nsv_charts("nsv/")[1]
