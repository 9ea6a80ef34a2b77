"""The reports' per-head evidence (:mod:`hydra_core.analysis.evidence`): ``heads.csv``, one row per
head with every evidence column and its 95% interval, and a short section of ``report.md``: the
heads of best agreed rank and where the evidence disagrees."""

from __future__ import annotations

import math

import pandas as pd
import torch

from hydra_core.analysis.evidence import COLUMN, RANKING_RULE, head_evidence
from hydra_core.cache import DiskCache
from hydra_core.data.images import take
from hydra_core.metrics.bootstrap import BootstrapConfig

#: the heads listed in report.md
TOP = 10


def evidence_table(
    loaded,
    benchmark,
    fit_x: torch.Tensor,
    fit_y: torch.Tensor,
    *,
    n: int | None,
    batch_size: int,
    cache: DiskCache | None = None,
) -> pd.DataFrame:
    """``heads.csv``: the evidence of every head of ``loaded.model``, its detectors fitted on the
    search tensors (``fit_x``, ``fit_y``: the ID search part), scored with at most ``n`` items of
    the ID report part and of each report OOD set (a fixed sample; None: all); the bootstrap is
    the report's (:class:`~hydra_core.metrics.bootstrap.BootstrapConfig` defaults); the
    ablations are kept in ``cache``. Rows in agreed order."""
    p, device = loaded.preprocess, fit_x.device
    id_set = take(benchmark.id_report, n, purpose="describe")
    ood = {
        s.name: p(take(s, n, purpose="describe").inputs).to(device) for s in benchmark.ood_report
    }
    config = BootstrapConfig()
    found = head_evidence(
        loaded.model,
        fit_x,
        fit_y,
        p(id_set.inputs).to(device),
        id_set.labels,
        ood,
        n_boot=config.n_boot,
        seed=config.seed,
        batch_size=batch_size,
        cache=cache,
    )
    table = found.table.sort_values("agreed_rank")
    return table.drop(columns=["keep_frequency", "rank_keep_frequency"]).reset_index(drop=True)


def _interval(row: pd.Series, key: str, signed: bool) -> str:
    value, lo, hi = row[key], row[f"{key}_lo"], row[f"{key}_hi"]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    sign = "+" if signed else ""
    mark = " ✱" if bool(row[f"{key}_significant"]) else ""
    return f"{value:{sign}.4f} [{lo:{sign}.4f}, {hi:{sign}.4f}]{mark}"


def heads_section(table: pd.DataFrame | None, k: int = TOP) -> list[str]:
    """The section of report.md: what the columns are, the ``k`` heads of best agreed rank with
    their intervals, how many intervals exclude the null, and the largest disagreements."""
    if table is None or table.empty:
        return []
    lines = [
        "## Per-head evidence: which heads drive OOD separation (heads.csv)",
        "",
        f"Every head's evidence on the report data, with 95% intervals (✱: the interval excludes "
        f"0, or 0.5 for the detector). **ΔAUROC**: {COLUMN['delta_auroc'].meaning}. "
        f"**Δaccuracy**: {COLUMN['delta_accuracy'].meaning}. **Detector AUROC**: "
        f"{COLUMN['detector_auroc'].meaning}. Ranking: {RANKING_RULE}. heads.csv lists every "
        "head. Keep frequencies (the share of stability resamples that kept a head) are not "
        "ranked here: the report's resamples are per circuit (see Stability of the circuits); "
        "`heads --stability FILE` adds those of a search's stability run.",
        "",
        "| rank | head | ΔAUROC | Δaccuracy | detector AUROC | mean rank | disagreement |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, row in table.sort_values("agreed_rank").head(k).iterrows():
        lines.append(
            f"| {int(row['agreed_rank'])} | {row['label']} | "
            f"{_interval(row, 'delta_auroc', True)} | {_interval(row, 'delta_accuracy', True)} | "
            f"{_interval(row, 'detector_auroc', False)} | {row['mean_rank']:.1f} | "
            f"{row['disagreement']:.1f} |"
        )
    total = len(table)
    drops = int((table["delta_auroc_significant"] & (table["delta_auroc_hi"] < 0)).sum())
    gains = int((table["delta_auroc_significant"] & (table["delta_auroc_lo"] > 0)).sum())
    detectors = int(table["detector_auroc_significant"].astype(bool).sum())
    lines += [
        "",
        f"Of {total} heads, ablating {drops} alone lowers the AUROC and ablating {gains} raises "
        f"it (interval excluding 0); {detectors} heads' own detector separates OOD from ID "
        "(interval excluding 0.5).",
    ]
    apart = table.sort_values(["disagreement", "agreed_rank"], ascending=[False, True]).head(5)
    apart = apart[apart["disagreement"] > 0]
    if len(apart):
        described = [
            f"{row['label']} (ΔAUROC rank {row['rank_delta_auroc']:g}, detector rank "
            f"{row['rank_detector_auroc']:g})"
            for _, row in apart.iterrows()
        ]
        lines += [
            "",
            "Where the evidence disagrees most (ranks out of "
            f"{total}, 1 = most important): {'; '.join(described)}.",
        ]
    return [*lines, ""]
