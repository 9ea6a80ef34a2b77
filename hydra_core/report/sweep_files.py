"""What a sweep writes besides its CSV: the plot (a matplotlib figure, every point with its 95%
interval as an error bar) and the short Markdown (what ran, on what, how long, the table)."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from hydra_core.report.markdown import render

#: per sweep: the metrics plotted (column, axis title), and the x column
PLOTS = {
    "layers": (
        [("accuracy", "accuracy"), ("ece", "ECE"), ("nll", "NLL"), ("all_auroc", "AUROC (all OOD)"),
         ("all_fpr95", "FPR95 (all OOD)")],
        "removed_per_layer",
    ),
    "members": (
        [("accuracy", "accuracy"), ("ece", "ECE"), ("nll", "NLL"), ("all_auroc", "AUROC (all OOD)"),
         ("latency_ratio", "latency / single")],
        "members",
    ),
    "corruption": (
        [("accuracy", "accuracy"), ("ece", "ECE"), ("nll", "NLL"), ("brier", "Brier")],
        "severity",
    ),
}  # fmt: skip
X_LABELS = {
    "removed_per_layer": "heads removed per layer",
    "members": "members M",
    "severity": "severity (0: clean)",
}


def _series(kind: str, table: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(panel row, line label, rows) of a sweep's plot; the reference (single model) as the
    label ``"single"``."""
    if kind == "layers":
        out = []
        for setting in ("zero-shot", "fine-tuned"):
            part = table[table["setting"] == setting]
            out += [(setting, m, part[part["method"] == m]) for m in ("Taylor", "CircAvg")]
            out.append((setting, "single", table[table["system"] == "single"]))
        return [s for s in out if len(s[2])]
    if kind == "members":
        out = [
            ("", f"Hydra, {s}", table[table["setting"] == s]) for s in ("zero-shot", "fine-tuned")
        ]
        others = [n for n in table["system"].unique() if n.startswith("Deep Ensembles")]
        out += [("", name, table[table["system"] == name]) for name in ("single", *others)]
        return [s for s in out if len(s[2])]
    pooled = table[table["corruption"].isin(["all", "none"])]
    return [("", name, pooled[pooled["system"] == name]) for name in pooled["system"].unique()]


def plot_sweep(kind: str, table: pd.DataFrame, setup: dict) -> Figure:
    """The sweep's figure: one panel per metric (a row per setting for the layers sweep), one
    line per system with its 95% intervals as vertical bars; the single model dashed across the
    x range, its interval a grey band."""
    metrics, x = PLOTS[kind]
    metrics = [(c, t) for c, t in metrics if c in table and table[c].notna().any()]
    series = _series(kind, table)
    rows = list(dict.fromkeys(r for r, _, _ in series))
    fig = Figure(figsize=(3.2 * len(metrics), 2.8 * len(rows) + 0.6), layout="constrained")
    axes = fig.subplots(len(rows), len(metrics), squeeze=False)
    xs = sorted(v for v in table[x].unique() if not math.isnan(v))
    for i, row in enumerate(rows):
        for j, (column, title) in enumerate(metrics):
            ax = axes[i][j]
            for r, label, part in series:
                if r != row or column not in part:
                    continue
                part = part.sort_values(x)
                lo, hi = part.get(f"{column}_lo"), part.get(f"{column}_hi")
                if label == "single" and kind != "corruption":
                    value = float(part[column].iloc[0])
                    ax.axhline(value, color="grey", linestyle="--", linewidth=1, label=label)
                    if lo is not None and not pd.isna(lo.iloc[0]):
                        ax.axhspan(float(lo.iloc[0]), float(hi.iloc[0]), color="grey", alpha=0.15)
                    continue
                (line,) = ax.plot(part[x], part[column], marker="o", label=label)
                if lo is not None and hi is not None:
                    # the interval as drawn bounds: a percentile interval (ECE's, say) need not
                    # contain the point estimate, so no error bar relative to it
                    ax.vlines(part[x], lo, hi, color=line.get_color(), linewidth=1.5)
            ax.set_title(f"{title}" + (f" ({row})" if row else ""), fontsize=9)
            ax.set_xticks(xs)
            ax.set_xlabel(X_LABELS[x], fontsize=8)
            ax.tick_params(labelsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8)
    model = setup.get("model", {}).get("name", "")
    fig.suptitle(f"{kind} sweep, {model} (95% intervals)", fontsize=10)
    return fig


def markdown_sweep(kind: str, table: pd.DataFrame, setup: dict) -> str:
    """``report.md`` of a sweep, written by the one Markdown writer
    (:func:`~hydra_core.report.markdown.render`): the command, the data, the wall time, then the
    table (each metric as value [lo, hi])."""
    sections = (
        lambda tables, setup: _heading(kind, setup),
        lambda tables, setup: [_table(tables[kind]), ""],
    )
    return render(sections, {kind: table}, setup)


def _heading(kind: str, setup: dict) -> list[str]:
    """The sweep's title and what it ran: the command, the model, the data, the wall time."""
    protocol = setup.get("protocol", {})
    n_report = protocol.get("id_report_n")
    if kind == "corruption":
        n = min(n_report, setup.get("config", {}).get("n_corrupt") or n_report)
        data = (
            f"the first {n} of the {n_report} ID report items, clean (severity 0) or corrupted "
            "(rows `all`: every corruption's items at a severity pooled)"
        )
    else:
        data = (
            f"{n_report} ID report items and the report sets "
            f"{', '.join(protocol.get('report_ood', []))}"
        )
    return [
        f"# {kind} sweep",
        "",
        f"Made with `{setup.get('command', '')}` in {setup.get('total_seconds', 0) / 60:.1f} min "
        f"on {setup.get('machine', '')}.",
        "",
        f"Model: {setup.get('model', {}).get('name', '')}. Heads chosen on "
        f"{protocol.get('id_search_n')} ID search items and the search sets "
        f"{', '.join(protocol.get('search_ood', []))}; every number on {data}, with its 95% "
        "stratified-bootstrap interval. See docs/sweeps.md.",
        "",
    ]


def _table(table: pd.DataFrame) -> str:
    metrics = [c for c in table.columns if f"{c}_lo" in table and f"{c}_hi" in table]
    plain = [c for c in table.columns if c not in metrics and not c.endswith(("_lo", "_hi"))]
    header = plain + metrics
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in table.iterrows():
        cells = [_cell(row[c]) for c in plain]
        for m in metrics:
            v, lo, hi = row[m], row[f"{m}_lo"], row[f"{m}_hi"]
            cells.append("–" if pd.isna(v) else f"{v:.4f} [{lo:.4f}, {hi:.4f}]")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _cell(value) -> str:
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.4g}"
    return str(value)
