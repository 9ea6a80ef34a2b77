"""The report's Markdown: ``report.md`` from the tables and the run's setup.

Only formatting lives here: every number comes from the tables, every sentence about the run from
its setup dict, so the same inputs always give the same text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from hydra_core.report.claims import INTERVAL_METHOD, near_far_verdicts, signed, verdict_tally
from hydra_core.report.heads import heads_section
from hydra_core.report.stability import stability_section

#: columns shown in percent with two decimals (also under a near_/far_/all_ prefix)
PERCENT = (
    "accuracy",
    "auroc",
    "fpr95",
    "aupr_in",
    "aupr_out",
    "search_accuracy",
    "search_auroc",
    "dense_search_accuracy",
    "dense_search_auroc",
)
#: columns shown with two decimals (times in ms, ratios) or one (seconds)
TWO_DECIMALS = (
    "latency_ms",
    "latency_iqr_ms",
    "latency_bf16_ms",
    "latency_bf16_iqr_ms",
    "params_ratio",
    "macs_ratio",
    "latency_ratio",
    "latency_bf16_ratio",
)
#: table headers; arrows say which way is better
HEADERS = {
    "system": "System",
    "kind": "Kind",
    "heads": "Heads",
    "accuracy": "Acc↑",
    "brier": "Brier↓",
    "nll": "NLL↓",
    "ece": "ECE↓",
    "adaptive_ece": "aECE↓",
    "auroc": "AUROC↑",
    "fpr95": "FPR95↓",
    "aupr_in": "AUPR-In↑",
    "aupr_out": "AUPR-Out↑",
    "id_mi": "ID MI",
    "id_di": "ID DI",
    "ood_mi": "OOD MI",
    "ood_di": "OOD DI",
    "pruning_seed": "Pruning seed",
    "batch_order": "Batch order",
    "max_prob_diff": "max |Δp|",
}


def jaccard_text(value) -> str:
    """A mean pairwise Jaccard for the text: ``0.412``, or what a one-member ensemble has
    instead of a number (no pair to compare)."""
    if value is None or value != value:
        return "– (one member: overlap needs two)"
    return f"{value:.3f}"


def _header(column: str) -> str:
    """A column's table header: near/far prefixes kept, ``all_`` dropped (OOD averages)."""
    for prefix, label in (("near_", "near "), ("far_", "far "), ("all_", "")):
        if column.startswith(prefix) and column[len(prefix) :] in HEADERS:
            return label + HEADERS[column[len(prefix) :]]
    return HEADERS.get(column, column.replace("_", " "))


def _cell(column: str, value: object) -> str:
    """One value as shown in the report; missing values (None, NaN) as a dash."""
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        base = column.split("_", 1)[1] if column.startswith(("near_", "far_", "all_")) else column
        if base in PERCENT:
            return f"{100 * value:.2f}"
        if column == "max_prob_diff":
            return f"{value:.1e}"
        if column in TWO_DECIMALS:
            return f"{value:,.2f}"
        if column == "seconds":
            return f"{value:,.1f}"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, (int, np.integer)):
        return f"{value:,}"
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    """A DataFrame as a Markdown table; accuracy and OOD metrics in percent. A column ``m`` with
    ``m_lo`` and ``m_hi`` beside it shows as ``value [lo, hi]`` (its 95% interval)."""
    columns = [
        c for c in frame.columns if not (c.endswith(("_lo", "_hi")) and c[:-3] in frame.columns)
    ]
    lines = [
        "| " + " | ".join(_header(c) for c in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(_interval_cell(c, row) for c in columns) + " |")
    return "\n".join(lines)


def _interval_cell(column: str, row: pd.Series) -> str:
    """The cell of ``column``, with its interval when the row has ``column_lo`` / ``_hi``."""
    value = _cell(column, row[column])
    lo, hi = row.get(f"{column}_lo"), row.get(f"{column}_hi")
    if lo is None or hi is None or value == "–" or lo != lo or hi != hi:
        return value
    return f"{value} [{_cell(column, lo)}, {_cell(column, hi)}]"


def markdown_report(
    tables: Mapping[str, pd.DataFrame], setup: dict, finetuned: Sequence[str]
) -> str:
    """The text of ``report.md``: setup, then every table with what it shows and how.

    Args:
        tables: the tables by CSV name, as :func:`~hydra_core.report.tables.report_tables` makes.
        setup: the run's description, as written to ``report.json`` (model, data, budgets,
            fine-tuning, timings).
        finetuned: labels of the fine-tuned Hydra variants (empty when zero-shot).
    """
    return "\n".join(
        [
            *_setup_section(setup),
            *_search_sections(tables),
            *stability_section(tables.get("stability"), markdown_table),
            *heads_section(tables.get("heads")),
            *_systems_sections(tables, finetuned),
            *_cost_section(tables, setup),
            *_coverage_section(),
        ]
    )


def _setup_section(setup: dict) -> list[str]:
    """Title, model, data, budgets, members, fine-tuning, metrics and stage durations."""
    b, model = setup["budgets"], setup["model"]
    ft = setup["finetune"]
    data = pd.DataFrame(setup["data"])
    data["description"] = data["name"].map(setup["data_descriptions"])
    seconds = pd.DataFrame(list(setup["seconds"].items()), columns=["stage", "seconds"])
    jaccard = ", ".join(
        f"{k} {jaccard_text(v['mean_pairwise_jaccard'])}"
        for k, v in setup["member_overlap"].items()
    )
    per_layer = b["removed_per_layer"]
    kept = model["heads"] - per_layer
    return [
        "# Hydra Ensembles on the default model: a replication report",
        "",
        f"Generated {setup['created']} by `{setup['command'] or 'python -m hydra_core report'}` in "
        f"{setup['total_seconds'] / 60:.1f} minutes on {setup['machine']} ({setup['device']}). "
        "Every number below was measured by this run; nothing is copied from the paper. Where our "
        "numbers disagree with the paper's, they are reported as they came out.",
        "",
        "## Setup",
        "",
        f"- **Model**: `{model['name']}`: {setup['model_description']}; {model['layers']} layers x "
        f"{model['heads']} heads (head dim {model['head_dim']}, width {model['embed_dim']}), "
        f"{model['params']:,} parameters.",
        _protocol_sentence(setup["protocol"]),
        "",
        markdown_table(data[["name", "role", "group", "n_search", "n_report", "description"]]),
        "",
        f"- **Budgets**: every pruned model removes {b['budget']} of {b['total']} heads "
        f"({per_layer} per layer for Taylor, i.e. {kept} of {model['heads']} kept, as the paper's "
        f"8 of 12). Circuits: the greedy Headmap search (Algorithm 1) removes {b['budget']} heads "
        "with the objective S_avg (CircAvg), S_acc (CircAcc) or S_ood (CircOOD). Taylor: "
        "layer-wise first-order Taylor pruning (D.1.1).",
        "- **Members**: **Hydra (Circ)** is the paper's method (B.2 question 3, D.3): one circuit "
        "per criterion, CircAcc, CircOOD and CircAvg, each from its own greedy search. "
        f"**Hydra (Circ, B.5)** is the paper's B.5 ablation, with one circuit available: M = "
        f"{setup['members']} members (pruning seeds {setup['pruning_seeds']}), each pruning "
        f"{b['budget']} heads drawn at random from the {b['pool']} least useful heads of the "
        'CircAvg ranking (the paper\'s "48 of 100"); **Hydra (Taylor)** draws them in the same '
        "way from the Taylor global ranking. Heads beyond the greedy search's "
        f"{b['budget']} steps are ranked by their score in its last step. Mean pairwise Jaccard "
        f"of the kept heads: {jaccard}.",
        f"- **Fine-tuning**: {_finetune_sentence(ft)}",
        "- **Deep Ensembles**: "
        + (
            f"{setup['deep_ensemble_members']} independently trained copies (the shipped model "
            "and copies with other seeds, same recipe)."
            if setup["deep_ensemble_members"]
            else "not available: no independently trained copies were found. Train them with "
            "`torchrun --standalone --nproc-per-node 2 -m hydra_core train-ensemble --threads 1 "
            "--seeds 1 2` (both at once in about 30 min on 2 CPU cores; resumable) and run the "
            "report again."
        ),
        "- **MC Dropout** (5 passes, the model's own dropout): "
        + (
            f"not run: {setup['mc_dropout_skipped'].split(':')[0]}."
            if setup.get("mc_dropout_skipped")
            else "in the tables."
        ),
        "- **Metrics** (docs/metrics.md): ensemble probabilities are the mean of "
        "member softmax probabilities; ECE with 15 equal-width bins, aECE with 15 equal-mass "
        "bins; OOD score = maximum softmax probability, OOD is the positive class (OpenOOD): "
        "AUROC, FPR95 (share of ID flagged OOD when 95% of OOD is caught), AUPR-In / AUPR-Out; "
        "near/far/all averages are unweighted means over the OOD sets of the group. MI = mutual "
        "information H(mean p) - mean H(p_m), DI = disagreement. Accuracy and OOD metrics in "
        "percent.",
        "",
        "Durations of the stages (seconds; cached searches and fine-tunes load instantly):",
        "",
        markdown_table(seconds),
        "",
    ]


def _protocol_sentence(protocol: dict) -> str:
    """Which images selected heads and which are reported, in words (a warning under halves)."""
    search, report = ", ".join(protocol["search_ood"]), ", ".join(protocol["report_ood"])
    if protocol["note"]:
        return f"- **Data**: **warning: {protocol['note']}** Search sets: {search}."
    return (
        f"- **Data**: heads are selected on {protocol['id_search_n']:,} Fashion-MNIST validation "
        f"images (held out of training) and the *search* OOD sets ({search}), which no table "
        f"uses; every table is computed on the {protocol['id_report_n']:,} test images and the "
        f"*report* OOD sets ({report}), as the paper extracts circuits against a dedicated OOD "
        'validation set excluded from its tables (C.1.5, D.1.2 "OOD sets and fairness"). Every '
        "metric carries a 95% bootstrap interval over the report images, shown as value [lo, hi] "
        "(stratified: ID resampled within each class, each OOD set within itself); differences "
        "between systems use paired resamples."
    )


def _search_sections(tables: Mapping[str, pd.DataFrame]) -> list[str]:
    """The greedy circuits, Table 4 (pruning), Table 5 (distances) and Table 6 (circuits)."""
    return [
        "## Circuits found by the greedy search",
        "",
        markdown_table(tables["circuits"].drop(columns=["removed"])),
        "",
        "(scores on the search split; `removed` lists the heads in removal order in "
        "`circuits.csv`.)",
        "",
        "## Table 4 - zero-shot pruning: Taylor vs CircAvg",
        "",
        markdown_table(tables["table4_zero_shot"]),
        "",
        _table4_ordering(tables["table4_zero_shot"]),
        "",
        "## Table 5 - ID/OOD centroid distances of the last layer's heads, CircOOD vs dense",
        "",
        "Mahalanobis with a Ledoit-Wolf regularised ID covariance, on the report images. In the "
        "paper's convention (first table) the distance is averaged over all H heads of the layer, "
        "so a head CircOOD removed counts with distance 0 (its output is zero for ID and OOD "
        "alike); in ours (second table) both columns average over the heads CircOOD keeps, so "
        "they differ only through the heads it removed in earlier layers.",
        "",
        markdown_table(_convention(tables["table5_distances"], "all")),
        "",
        markdown_table(_convention(tables["table5_distances"], "kept")),
        "",
        "## Table 6 - CircAcc vs CircOOD",
        "",
        markdown_table(tables["table6_circuits"]),
        "",
        "## Transfer - does the circuits' OOD gain reach sets the search never saw?",
        "",
        "AUROC of each circuit minus the dense model's on every report set, with the paired 95% "
        "interval of the difference; `significant` = the interval excludes 0. CircOOD and CircAvg "
        "were searched on the search sets only, so every report set is unseen. The last row is a "
        "leave-one-set-out run: CircOOD searched on halves of the other report sets, measured on "
        "the set it left out.",
        "",
        markdown_table(tables["transfer"]),
        "",
    ]


def _systems_sections(tables: Mapping[str, pd.DataFrame], finetuned: Sequence[str]) -> list[str]:
    """Tables 1-2 (every system), Table 9 (diversity) and Table 11 (fusion)."""
    t1 = tables["table1_systems"].drop(
        columns=[c for c in tables["table1_systems"] if c.startswith(("near_", "far_"))]
    )
    near_far = tables["table1_systems"][
        [
            "system",
            "heads",
            *(c for c in tables["table1_systems"] if c.startswith(("near_", "far_"))),
        ]
    ]
    return [
        "## Tables 1-2 - every system on every metric",
        "",
        "OOD columns are averages over all OOD sets; near/far below. Rows marked fine-tuned were "
        "fine-tuned after pruning; the others are zero-shot.",
        "",
        markdown_table(t1),
        "",
        markdown_table(near_far),
        "",
        "Every system on every set is in `all_sets.csv`; one row per system (members alone "
        "included) in `summary_all_systems.csv`.",
        "",
        "Each system minus the single model, on the same report images, with the paired 95% "
        "bootstrap interval of the difference; a difference is significant only where its "
        "interval excludes 0 (`differences_to_single.csv`).",
        "",
        markdown_table(_main_differences(tables)),
        "",
        *_score_gains_section(tables.get("ood_gain_by_score")),
        "## Table 9 - sources of diversity",
        "",
        "Members that differ by their criterion (Hydra (Circ): CircAcc, CircOOD, CircAvg) or by "
        "their pruning seed (Hydra (Circ, B.5)) against members that keep the same heads (the "
        "CircAvg circuit M times)"
        + (
            ", and, fine-tuned, members trained with the same or different batch orders"
            if finetuned
            else ""
        )
        + ". Zero-shot identical members are the same model M times, so their MI and DI are 0 "
        "by construction.",
        "",
        markdown_table(tables["table9_diversity"]),
        "",
        *_seed_section(tables["table12_seeds"]),
        *_over_repeats_section(tables.get("differences_over_repeats")),
        *_claims_section(tables.get("paper_claims"), tables["table12_seeds"]["repeat"].nunique()),
        "## Table 11 - fused vs non-fused members",
        "",
        "Fused: one Hydra model, MLPs averaged over members. Non-fused: members run separately, "
        "probabilities averaged. `max |Δp|` is the largest difference of the two ensembles' "
        "probabilities on any image: float error for zero-shot members (their MLPs are the same), "
        "the effect of MLP averaging for fine-tuned ones.",
        "",
        markdown_table(tables["table11_fusion"]),
        "",
    ]


def _score_gains_section(gains: pd.DataFrame | None) -> list[str]:
    """Does each system's OOD gain hold under every score (``ood_gain_by_score.csv``)."""
    if gains is None or gains.empty:
        return []
    shown = pd.DataFrame({"score": gains["score"], "system": gains["system"]})
    for g in ("near", "far"):
        shown[f"{g}_auroc"] = gains[f"{g}_auroc"]
        for suffix in ("", "_lo", "_hi"):  # AUROC points, as the AUROCs are shown
            shown[f"{g} ΔAUROC (points){suffix}"] = 100 * gains[f"{g}_delta{suffix}"]
        shown[f"{g} gain holds"] = gains[f"{g}_holds"]
    return [
        "## Does each system's OOD gain hold under every score",
        "",
        "Near- and far-OOD AUROC of each system under every OOD score, and its difference to "
        "the single model under the same score with the paired 95% interval (in AUROC points); "
        "the gain holds where the interval lies above 0. Max logit, energy, entropy, "
        "Mahalanobis, ViM and KNN come from pytorch-ood; the last three read each model's "
        "penultimate features and are fitted on the ID search split only, so the fused Hydra "
        "rows have them through their unfused twins (docs/ood-scores.md). Mutual information "
        "has no single-model reference, so no row here (`ood_gain_by_score.csv`).",
        "",
        markdown_table(shown),
        "",
    ]


def _main_differences(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The differences to the single model of the systems Tables 1-2 show."""
    shown = set(tables["table1_systems"]["system"])
    frame = tables["differences_to_single"]
    return frame[frame["system"].isin(shown)].drop(columns="kind")


def _convention(table5: pd.DataFrame, how: str) -> pd.DataFrame:
    """Table 5's rows of one convention of averaging over heads."""
    return table5[table5["heads_averaged"] == how].drop(columns="heads_averaged")


def _seed_section(seeds: pd.DataFrame) -> list[str]:
    """Table 12: the seeded systems, mean ± std over the repeats."""
    metrics = [c for c in seeds.columns if c not in ("repeat", "system")]
    grouped = seeds.groupby("system", sort=False)[metrics]
    mean, std = grouped.mean(), grouped.std(ddof=1)
    shown = pd.DataFrame(index=mean.index)
    for metric in metrics:
        scale = 100 if metric.split("_")[-1] in ("accuracy", "auroc") else 1
        digits = 2 if scale == 100 else 4
        shown[_header(metric)] = [
            "–" if m != m else f"{scale * m:.{digits}f} ± {scale * s:.{digits}f}"
            for m, s in zip(mean[metric], std[metric], strict=True)
        ]
    repeats = seeds["repeat"].nunique()
    return [
        f"## Table 12 - the seeded systems over {repeats} repeats",
        "",
        "Mean ± standard deviation over repeats that change the search subsample, the pruning "
        "seeds and the fine-tuning batch order together (the report images stay the same, so "
        "this is the seeds' spread; the bootstrap intervals above are the images'). Repeat 0 is "
        "the run of the tables above; per-repeat rows in `table12_seeds.csv`.",
        "",
        markdown_table(shown.reset_index()),
        "",
    ]


def _over_repeats_section(frame: pd.DataFrame | None) -> list[str]:
    """The seeded systems minus the single model (and the Hydras minus Deep Ensembles) over the
    repeats, with two-level intervals."""
    if frame is None or frame.empty:
        return []
    repeats = int(frame["repeats"].iloc[0])
    lines = [
        f"### Differences over the {repeats} repeats",
        "",
        "The mean of the repeats' paired differences, with an interval that carries the "
        f"seeds' variance as well as the images'. {INTERVAL_METHOD} A statement about a seeded "
        "system holds across repeats only where this interval excludes 0 "
        "(`differences_over_repeats.csv`).",
        "",
    ]
    for reference, rows in frame.groupby("reference", sort=False):
        lines += [
            f"Minus **{reference}**:",
            "",
            markdown_table(rows.drop(columns=["repeats", "reference"])),
            "",
        ]
    return lines


def _claims_section(claims: pd.DataFrame | None, repeats: int) -> list[str]:
    """The paper's Table 1 statements with our mean difference over the repeats, its two-level
    interval and the verdict; then how many agree, disagree or cannot be decided."""
    if claims is None or claims.empty:
        return []
    shown = pd.DataFrame(
        {
            "the paper says (ImageNet-1K, Table 1)": claims["claim"],
            "paper": [f"{v:+.2f}" for v in claims["paper_difference"]],
            f"ours, mean of {repeats} repeats": [
                signed(m, v, lo, hi)
                for m, v, lo, hi in claims[["metric", "ours", "ours_lo", "ours_hi"]].itertuples(
                    index=False
                )
            ],
            "verdict": claims["verdict"],
            "verdict, near / far OOD": near_far_verdicts(claims, "ours"),
        }
    )
    untested = claims[claims["verdict"] == "–"]
    no_deep = "Deep Ensembles" in {*untested["system"], *untested["reference"]}
    return [
        f"## The paper's statements over the {repeats} repeats",
        "",
        "Each statement is a difference between two rows of the paper's Table 1 (ImageNet-1K, "
        "ViT-B/16); ours is the same difference between our systems (Hydras fine-tuned after "
        "pruning, as the paper's; CircAvg and Taylor zero-shot, as its Table 4), the mean over "
        "the repeats with the two-level interval of Differences over the repeats. **agrees**: "
        "the interval excludes 0 on the paper's side; **disagrees**: on the other side; "
        "**n.s.**: it holds 0, so this run cannot decide the statement at this scale. The "
        "settings differ (a 1.8M-parameter ViT on Fashion-MNIST, other OOD sets), so directions "
        "are compared, not sizes (`paper_claims.csv`). A statement over all OOD sets is judged "
        "on the near and the far sets apart too.",
        "",
        markdown_table(shown),
        "",
        f"Of {verdict_tally(claims['claim'], claims['verdict'])}"
        + (" The statements about Deep Ensembles need their trained copies." if no_deep else ""),
        "",
    ]


#: Table 7's columns, in the order every report shows them (those a run measured)
COST_COLUMNS = (
    "system",
    "params",
    "formula_params",
    "macs",
    "latency_ms",
    "latency_iqr_ms",
    "latency_bf16_ms",
    "params_ratio",
    "macs_ratio",
    "latency_ratio",
    "latency_bf16_ratio",
)


def cost_columns(cost: pd.DataFrame) -> pd.DataFrame:
    """Table 7 with the columns of :data:`COST_COLUMNS` it has, in that order."""
    return cost[[c for c in COST_COLUMNS if c in cost]]


def _cost_section(tables: Mapping[str, pd.DataFrame], setup: dict) -> list[str]:
    """Table 7: parameters, multiply-adds and latency."""
    cost = tables["table7_cost"]
    return [
        "## Table 7 - cost",
        "",
        f"Parameters as stored; multiply-adds and latency for a batch of "
        f"{setup['config']['latency_batch']} images (latency: median of "
        f"{setup['config']['latency_repeats']} round-robin calls, ms, on {setup['device']}; "
        "bf16 only on CUDA). `formula params` is the paper's per-layer count (B.4: 12d² single, "
        "4M(H_l/H)d² + 8d² Hydra with the MLP ratio of this model) summed over layers. The paper "
        "measured Hydra/single 1.07x in bf16 and 2.66x in fp32 and Deep Ensembles 2.99x on a GPU "
        "with ViT-B/16; a small model on a CPU need not behave the same.",
        "",
        markdown_table(cost_columns(cost)),
        "",
        *_parameter_note(setup["parameters"]),
    ]


def _parameter_note(parameters: dict) -> list[str]:
    """Why the fused model's stored parameters differ from the paper's formula, by kind."""
    fused = next((v for k, v in parameters.items() if k != "single" and v), None)
    if fused is None:
        return []
    frame = pd.DataFrame({"single": parameters["single"], "Hydra (Circ) (fused)": fused})
    frame.loc["total"] = frame.sum()
    return [
        "Parameters by kind. The paper's formula counts only the attention and MLP weights. The "
        "fused model also stores biases, LayerNorms, the patch and position embedding and the "
        "classifier (once where the members share them, else per member), and its attention "
        "weights are padded: in a layer where members keep different numbers of heads, every "
        "member gets the layer's largest count, the padding rows zero (one grouped matrix "
        "multiply per layer needs equal groups).",
        "",
        markdown_table(frame.rename_axis("kind").reset_index()),
        "",
    ]


def _table4_ordering(table4: pd.DataFrame) -> str:
    """One sentence comparing Table 4's accuracy ordering with the paper's (CircAvg above
    Taylor in accuracy on every model of its Table 4)."""
    accuracy = table4.set_index("system")["accuracy"]
    if not {"Taylor", "CircAvg"} <= set(accuracy.index):
        return ""
    circ, taylor = accuracy["CircAvg"], accuracy["Taylor"]
    if circ >= taylor:
        return (
            f"Accuracy: CircAvg {100 * circ:.2f}% vs Taylor {100 * taylor:.2f}%, the paper's "
            "ordering (CircAvg keeps accuracy better than Taylor)."
        )
    return (
        f"Accuracy: CircAvg {100 * circ:.2f}% vs Taylor {100 * taylor:.2f}%: the reverse of the "
        "paper's ordering, where CircAvg keeps accuracy better than Taylor. Here the greedy search "
        "trades accuracy for OOD separation (S_avg weighs both equally), while Taylor's "
        "gradient saliency is an accuracy criterion."
    )


#: what the report reproduces of the paper, item by item: (item, status, why)
COVERAGE = (
    (
        "Table 1 (ImageNet-1K, CIFAR-100: every system, every metric)",
        "partly",
        "the same systems and metrics on the default Fashion-MNIST ViT; no ImageNet/CIFAR "
        "weights or data are reachable offline",
    ),
    (
        "Table 2 (text classification, BERT on SST-2)",
        "partly",
        "in its own report, `report --task text` (docs/report/text): MiniLM on Rotten Tomatoes",
    ),
    (
        "Table 3 (zero-shot CLIP)",
        "not",
        "its own report, `report --task zero-shot --model openclip:...` (OpenCLIP image "
        "tower); it needs CLIP weights, which no package registry carries, so it has not been "
        "run here",
    ),
    ("Table 4 (zero-shot Taylor vs CircAvg)", "reproduced", "on this model; see its note"),
    (
        "Table 5 (ID/OOD centroid distances, circuit vs dense)",
        "reproduced",
        "in the paper's convention (all heads) and ours (kept heads)",
    ),
    ("Table 6 (CircAcc vs CircOOD)", "reproduced", "one search per objective"),
    (
        "Table 7 (inference cost)",
        "partly",
        "parameters, multiply-adds and CPU fp32 latency; the paper's bf16 GPU figures need a GPU",
    ),
    (
        "Table 8 (which diversity sources to keep)",
        "partly",
        "pruning seed and batch order are varied in Table 9; data order and initialisation of a "
        "new head are not",
    ),
    (
        "Table 9 (diversity ablations)",
        "reproduced",
        "criterion (three circuits), pruning seed and fine-tuning batch order",
    ),
    (
        "Table 10 (number of members)",
        "partly",
        "M = 3 here; M = 2..5 in `sweep --kind members` (docs/report/sweeps/members)",
    ),
    ("Table 11 (MLP fusion)", "reproduced", "fused vs unfused, zero-shot and fine-tuned"),
    (
        "Table 12 (results over 8 seeds)",
        "partly",
        "the seeded systems over the run's repeats (mean ± std, and differences with two-level "
        "intervals over repeats and images)",
    ),
    (
        "Tables 13-14 (ImageNet-C shift)",
        "partly",
        "not here: `sweep --kind corruption` (docs/report/sweeps/corruption) corrupts the ID test "
        "images at 5 severities with the ImageNet-C corruptions that make sense on 28x28 grayscale",
    ),
    ("Figure 3 (inference cost plot)", "partly", "Table 7's numbers; no GPU plot"),
    (
        "Figure 4 (representations of the most/least important heads)",
        "partly",
        "in the app (Representations page), not in this report",
    ),
    (
        "Figures 5-6 (accuracy/OOD vs heads pruned)",
        "partly",
        "one budget here; 2/4/6/8 heads per layer in `sweep --kind layers` "
        "(docs/report/sweeps/layers)",
    ),
    (
        "Proposition 1 (pruning is worse under noise)",
        "not",
        "a theoretical statement; its assumption (B.1) is not tested here",
    ),
    (
        "Appendix B.2 (per-head CLS representations)",
        "reproduced",
        "Table 5 and the app's Representations page",
    ),
)


def _coverage_section() -> list[str]:
    """What of the paper this report covers, and why not the rest."""
    frame = pd.DataFrame(COVERAGE, columns=["paper", "status", "why"])
    return [
        "## What this report covers",
        "",
        "Each table and figure of the paper, whether this report reproduces it (on this model: "
        "a small ViT trained from scratch on Fashion-MNIST, not the paper's models), and why not "
        "where it does not.",
        "",
        markdown_table(frame),
        "",
    ]


def _finetune_sentence(ft: dict | None) -> str:
    """The fine-tuning recipe in words, from :class:`FinetuneConfig` as a dict (None: none)."""
    if ft is None:
        return "none (zero-shot only)."
    length = f"{ft['steps']} steps" if ft["steps"] else f"{ft['epochs']} epoch(s)"
    return (
        f"each pruned model separately, {ft['optimizer']} lr {ft['lr']}, {length} of "
        f"{ft['n_train']} Fashion-MNIST training images, batch {ft['batch_size']}, "
        f"{ft['warmup_steps']} warm-up steps then cosine decay, label smoothing "
        f"{ft['label_smoothing']}, trainable: {', '.join(ft['trainable'])} (D.2); members "
        "fused afterwards with averaged MLPs. Same batch order for every member unless a "
        "row says otherwise."
    )
