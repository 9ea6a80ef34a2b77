"""The image report's ``report.md``: Tables 1-2 (every system), the OOD gain under every score,
Table 12 (seeds), the differences over repeats, the paper's claims
(:mod:`~hydra_core.report.image_markdown_claims`), Table 9, Table 11 and the cost (Table 7)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from hydra_core.report.claims import INTERVAL_METHOD
from hydra_core.report.image_markdown_claims import claims_sections
from hydra_core.report.markdown import (
    column_header,
    cost_columns,
    markdown_table,
    score_gains_section,
)


def systems_sections(
    tables: Mapping[str, pd.DataFrame], finetuned: Sequence[str], setup: Mapping | None = None
) -> list[str]:
    """Tables 1-2 (every system), Table 9 (diversity) and Table 11 (fusion); ``setup`` says
    which efficient ensembles were not run (their statements are listed as not judged)."""
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
        "fine-tuned after pruning; the others are zero-shot. The efficient ensembles "
        "(Packed-Ensembles, MIMO, BatchEnsemble, LoRA Ensembles; kind `efficient-ensemble`) are "
        "their stored trained copies, one each (the setup says which were not run).",
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
        *score_gains_section(tables.get("ood_gain_by_score")),
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
        *claims_sections(
            tables.get("paper_claims"), tables["table12_seeds"]["repeat"].nunique(), setup
        ),
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


def _main_differences(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The differences to the single model of the systems Tables 1-2 show."""
    shown = set(tables["table1_systems"]["system"])
    frame = tables["differences_to_single"]
    return frame[frame["system"].isin(shown)].drop(columns="kind")


def _seed_section(seeds: pd.DataFrame) -> list[str]:
    """Table 12: the seeded systems, mean ± std over the repeats."""
    metrics = [c for c in seeds.columns if c not in ("repeat", "system")]
    grouped = seeds.groupby("system", sort=False)[metrics]
    mean, std = grouped.mean(), grouped.std(ddof=1)
    shown = pd.DataFrame(index=mean.index)
    for metric in metrics:
        scale = 100 if metric.split("_")[-1] in ("accuracy", "auroc") else 1
        digits = 2 if scale == 100 else 4
        shown[column_header(metric)] = [
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


def cost_section(tables: Mapping[str, pd.DataFrame], setup: dict) -> list[str]:
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
