"""Figure 5 of Snyder & Vishwanath: the sample-compression bound on the test error against depth (ReLU MLP of width
16, no biases), with ``n·s/m`` (``n`` hidden neurons, ``s`` support vectors) and the measured validation error.

The bound (DESIGN.md §2; the paper's statement was not recovered) holds with probability ``>= 1 - δ`` (δ = 0.05):
``(n·s·ln 2 + ln C(m, s) + ln(m/δ)) / (m − s)``. It is reported even when it exceeds 1, as it does on small data.

    python examples/bound_vs_depth.py          # bundled digits, depths 1 ... 6 (trains like sv_vs_depth.py)
    python examples/bound_vs_depth.py --from-trials runs/sv_vs_depth/sv_vs_depth_trials.csv   # no retraining
    python examples/bound_vs_depth.py --data mnist --data-root data --m 20000
"""
from __future__ import annotations

from functools import partial

from sv_vs_depth import parser_for

from lightning_nsv.experiments import mlp_point, parse, read_trials, replot, run_sweep, summarise, write_results
from lightning_nsv.plotting import plot_sweep

NAME = "bound_vs_depth"
TABLE = {"depth": "depth d", "reached": "trials at zero error", "n_support": "s", "support_fraction": "s/m",
         "ns_over_m": "n·s/m", "compression_bound": "bound", "val_error_network": "val error"}


def figure(summary: list[dict], title: str):
    fig, ax = plot_sweep(summary, "depth", {"compression_bound": "compression bound", "ns_over_m": "n·s/m",
                                            "val_error_network": "validation error"},
                         xlabel="hidden layers d", ylabel="bound, n·s/m and error (log scale)", logy=True,
                         title=title)
    ax.axhline(1.0, color="0.5", ls=":", lw=0.8)
    return fig


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(parser_for(NAME, __doc__), argv)
    if args.quick:
        args.depths, args.m = [1, 3], args.m or 60
    title = f"{args.data}: width {args.width}, δ = 0.05"
    if args.replot:
        return replot(args, NAME, lambda summary: figure(summary, title), ["depth"])
    if args.from_trials:
        rows = read_trials(args, ["depth", "m", "zero_error"])
    else:
        rows = run_sweep(args, [{"depth": d} for d in args.depths], partial(mlp_point, args),
                         callback_kwargs={"intercept": args.intercept})
    for row in rows:
        if row.get("zero_error"):
            row["n_hidden"] = row["depth"] * args.width
            row["ns_over_m"] = row["n_hidden"] * row["n_support"] / row["m"]
    summary = summarise(rows, ["depth"], ["n_support", "support_fraction", "ns_over_m", "compression_bound",
                                          "val_error_network"])
    write_results(args, NAME, rows, summary, {"": figure(summary, title)}, TABLE, step_key="depth")
    return summary


if __name__ == "__main__":
    main()
