"""The study report's figures (matplotlib, files only).

    score_against_labels(series, path)   SST-2 accuracy at 500 / 1,000 / 5,000 labels and IMDB at 1,000, per arm:
                                         the mean over seeds with its 95% t-interval, each seed a dot
    gains_against_labels(gains, path)    the same cells as paired gains of each pre-trained arm over its random arm,
                                         with their 95% t-intervals (an endpoint is met where the bar clears 0)
    mlm_curves(curves, path)             held-out MLM accuracy against the optimizer step, one panel per corpus
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

SST2_BUDGETS = (500, 1000, 5000)


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def score_against_labels(series: Mapping[str, Mapping[str, dict]], path: Path) -> Path:
    """series: {arm: {"sst2/500": {"values": [...], "mean", "low", "high"}, ..., "imdb/1000": {...}}}; a cell without
    values is left out (the report says it is missing)."""
    plt = _pyplot()
    fig, (sst2, imdb) = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True,
                                     gridspec_kw={"width_ratios": [3, 2]})
    arms = list(series)
    missing = []
    for k, arm in enumerate(arms):
        shift = 1 + (k - (len(arms) - 1) / 2) * 0.025    # side by side, on the log axis
        style = {"color": f"C{k}", **({"linestyle": "--"} if arm == "bag_of_words" else {})}
        xs, means, errors = [], [], [[], []]
        for budget in SST2_BUDGETS:
            cell = series[arm].get(f"sst2/{budget}")
            if not cell or not cell["values"]:
                continue
            x = budget * shift
            sst2.scatter([x] * len(cell["values"]), cell["values"], s=8, color="grey", alpha=0.5)
            xs.append(x), means.append(cell["mean"])
            errors[0].append(cell["mean"] - cell["low"] if cell.get("low") is not None else 0.0)
            errors[1].append(cell["high"] - cell["mean"] if cell.get("high") is not None else 0.0)
        if xs:
            sst2.errorbar(xs, means, yerr=errors, marker="o", capsize=3, label=arm, **style)
        else:
            missing.append(arm)
        cell = series[arm].get("imdb/1000")
        if cell and cell["values"]:
            imdb.scatter([k] * len(cell["values"]), cell["values"], s=8, color="grey", alpha=0.5)
            low = cell["mean"] - cell["low"] if cell.get("low") is not None else 0.0
            high = cell["high"] - cell["mean"] if cell.get("high") is not None else 0.0
            imdb.errorbar([k], [cell["mean"]], yerr=[[low], [high]], marker="o", capsize=3, color=f"C{k}")
        else:
            imdb.annotate("missing", (k, 0.5), rotation=90, ha="center", va="bottom", fontsize=8, color="grey")
    sst2.set_xscale("log")
    sst2.set_xticks(list(SST2_BUDGETS), [f"{b:,}" for b in SST2_BUDGETS])
    sst2.minorticks_off()
    sst2.set_xlabel("labelled training sentences")
    sst2.set_ylabel("accuracy on SST-2 dev")
    sst2.set_title("SST-2: mean over seeds, 95% t-interval; dots: seeds")
    if sst2.get_legend_handles_labels()[0]:
        sst2.legend(fontsize=8)
    if missing:
        sst2.text(0.99, 0.01, "missing: " + ", ".join(missing), transform=sst2.transAxes, ha="right", va="bottom",
                  fontsize=8, color="grey")
    imdb.set_xticks(range(len(arms)), arms, rotation=30, ha="right")
    imdb.set_ylabel("accuracy on the IMDB test reviews")
    imdb.set_title("IMDB, 1,000 labelled reviews")
    for ax in (sst2, imdb):
        ax.axhline(0.5, color="grey", linewidth=0.8, linestyle=":")
        ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def gains_against_labels(gains: Mapping[str, Mapping[str, dict]], path: Path) -> Path:
    """gains: {arm: {"sst2/500": paired(...) with "against", ...}}; a gain without its interval is drawn as a point."""
    plt = _pyplot()
    cells = [f"sst2/{b}" for b in SST2_BUDGETS] + ["imdb/1000"]
    fig, ax = plt.subplots(figsize=(11, 5), constrained_layout=True)
    arms = list(gains)
    for k, arm in enumerate(arms):
        xs, means, errors = [], [], [[], []]
        for i, cell in enumerate(cells):
            pair = gains[arm].get(cell)
            if not pair or pair["mean"] is None:
                continue
            xs.append(i + (k - (len(arms) - 1) / 2) * 0.1), means.append(pair["mean"])
            errors[0].append(pair["mean"] - pair["low"] if pair["low"] is not None else 0.0)
            errors[1].append(pair["high"] - pair["mean"] if pair["high"] is not None else 0.0)
        label = f"{arm} - {next(iter(gains[arm].values()))['against']}" + ("" if xs else " (missing)")
        ax.errorbar(xs, means, yerr=errors, marker="o", linestyle="none", capsize=3, color=f"C{k + 2}", label=label)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(cells)), ["SST-2 500", "SST-2 1,000", "SST-2 5,000", "IMDB 1,000"])
    ax.set_ylabel("paired gain in accuracy")
    ax.set_title("Gain over random initialisation of the same vocabulary: mean over seeds, 95% t-interval")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def mlm_curves(curves: Mapping[str, Sequence[tuple[int, float]]], path: Path) -> Path:
    """curves: {run name: [(step, held-out MLM accuracy), ...]}; the corpus is the name's first word
    (general_120 -> general)."""
    plt = _pyplot()
    corpora = sorted({name.split("_")[0] for name in curves}) or ["(none)"]
    fig, axes = plt.subplots(1, len(corpora), figsize=(6 * len(corpora), 4.5), constrained_layout=True,
                             squeeze=False)
    for ax, corpus in zip(axes[0], corpora):
        for name, points in sorted(curves.items()):
            if name.split("_")[0] == corpus and points:
                steps, values = zip(*points)
                ax.plot([s + 1 for s in steps], values, marker="o", markersize=3, label=name)
        ax.set_title(f"{corpus} corpus: held-out MLM accuracy")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("val/mlm_acc")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
