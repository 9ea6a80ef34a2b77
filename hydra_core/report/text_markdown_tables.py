"""The text report's ``report.md``: Table 2 with Tables 17-20, the agreements with the paper
(its claims over the repeats, then those about the efficient ensembles on repeat 0), fusion and
cost."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from hydra_core.report.claims import (
    INTERVAL_METHOD,
    PERCENT,
    near_far_verdicts,
    paper_frame,
    signed,
    verdict_counts,
)
from hydra_core.report.efficient_ensembles import judged
from hydra_core.report.markdown import cost_columns, markdown_table
from hydra_core.report.text_claims import not_judged


def table2_section(tables: Mapping[str, pd.DataFrame], setup: dict) -> list[str]:
    main = tables["table2_systems"]
    per_set = tables["per_set"]
    return [
        "## Table 2 - every system",
        "",
        "`trained after pruning`: yes = the pruned model or members were fine-tuned after pruning "
        "(the paper's setting for its text rows, D.2), no = zero-shot. OOD columns average the "
        "report OOD sets.",
        "",
        markdown_table(main),
        "",
        "The paper's Table 2 and Table 17 (bert-base-uncased on SST-2; no intervals given; its "
        "OOD averages are over Yelp and Amazon polarity (near) and 20 Newsgroups, TREC, MNLI, "
        "RTE and WMT16 (far); our LoRA Ensembles row is its stored copy, where there is one), for "
        "reference:",
        "",
        markdown_table(paper_frame(tables["paper_table2"])),
        "",
        "## Table 17 - near and far OOD",
        "",
        markdown_table(tables["table17_near_far"]),
        "",
        "## Tables 18-20 - every OOD set (AUROC, then FPR95)",
        "",
        markdown_table(_pivot(per_set, "auroc", list(main["system"]))),
        "",
        markdown_table(_pivot(per_set, "fpr95", list(main["system"]))),
        "",
        "## Differences to the single model",
        "",
        "Each system minus the single model on the same report sentences, with the paired 95% "
        "bootstrap interval of the difference; a difference is significant only where its "
        "interval excludes 0 (`differences_to_single.csv`; accuracy and AUROC in points).",
        "",
        markdown_table(tables["differences_to_single"].drop(columns="kind")),
        "",
    ]


def _pivot(per_set: pd.DataFrame, metric: str, rows: list[str]) -> pd.DataFrame:
    """One row per system of ``rows`` (in that order), one column per OOD set: ``metric`` with
    its interval in the cell."""
    cells = per_set.assign(
        cell=[
            _with_interval(metric, v, lo, hi)
            for v, lo, hi in zip(
                per_set[metric], per_set[f"{metric}_lo"], per_set[f"{metric}_hi"], strict=True
            )
        ]
    )
    shown = [r for r in rows if r in set(cells["system"])]
    order = list(dict.fromkeys(cells["set"]))
    pivot = cells.pivot(index="system", columns="set", values="cell").loc[shown, order]
    return pivot.rename_axis(columns=None).reset_index()


def _with_interval(metric: str, value: float, lo: float, hi: float) -> str:
    scale = 100 if metric in PERCENT else 1
    if value != value:
        return "–"
    return f"{scale * value:.2f} [{scale * lo:.2f}, {scale * hi:.2f}]"


def claims_section(
    claims: pd.DataFrame, setup: dict, repeats: pd.DataFrame | None = None
) -> list[str]:
    """The paper's statements over the repeats against our paired differences, and a count of the
    verdicts (those about the efficient ensembles: :func:`efficient_claims_section`)."""
    claims = judged(claims, repeat_0=False)
    return [
        "## Agreements and disagreements with the paper",
        "",
        "Each statement Table 2 makes about a pair of systems (its difference in the paper's "
        "numbers: accuracy and OOD metrics in points) against our paired difference with its 95% "
        "interval. *agrees*: same direction, interval excludes 0; *disagrees*: opposite "
        "direction, interval excludes 0; *n.s.*: our interval contains 0. Systems that are not "
        "pruned (Single, Deep Ensembles (D), MC Dropout) are the same in both columns; pruned "
        "ones are compared zero-shot and fine-tuned after pruning (the paper fine-tunes). The "
        "paper gives no intervals, so a small difference of its own may be noise too.",
        "",
        *_repeats_sentence(repeats),
        markdown_table(_shown(claims)),
        "",
        *verdict_counts(claims),
        "",
    ]


def efficient_claims_section(claims: pd.DataFrame, setup: dict) -> list[str]:
    """The paper's statements about LoRA Ensembles, judged on repeat 0 alone where its stored
    copy ran; listed as not judged where it did not."""
    claims = judged(claims, repeat_0=True)
    facts = setup.get("efficient_ensembles") or {}
    missing = not_judged(facts.get("included", [])) if facts.get("looked_for") else []
    if (claims is None or claims.empty) and not missing:
        return []
    lines = ["## The paper's statements about the efficient ensembles (repeat 0)", ""]
    if claims is not None and not claims.empty:
        lines += [
            'The paper: "Compared to Deep Ensembles (D), classical lightweight approaches such '
            "as MC Dropout and LoRA Ensembles are close in accuracy but show weaker OOD "
            'detection" (5.2; "close" is no direction, so it is not judged: Table 2 shows the '
            "accuracies), and Hydra (Circ) against LoRA Ensembles as Table 2's rows have it. "
            "LoRA Ensembles is one stored copy, not seeded per repeat, so these are judged on "
            "repeat 0 alone: the paired difference with its 95% bootstrap interval over the "
            "report sentences, without the seeds' variance (`paper_claims.csv`, `judged_on`). "
            "Verdicts as above.",
            "",
            markdown_table(_shown(claims)),
            "",
            *verdict_counts(claims),
            "",
        ]
    if missing:
        lines += [
            f"Not judged (not run, see the setup): the statements about {', '.join(missing)}.",
            "",
        ]
    return lines


def _shown(claims: pd.DataFrame) -> pd.DataFrame:
    """The statements as report.md shows them: the paper's difference, ours in both forms."""
    return pd.DataFrame(
        {
            "paper says": claims["claim"],
            "paper": [f"{v:+.2f}" for v in claims["paper_difference"]],
            "ours, zero-shot": [
                signed(r["metric"], r["zero_shot"], r["zero_shot_lo"], r["zero_shot_hi"])
                for _, r in claims.iterrows()
            ],
            "verdict (zero-shot)": claims["zero_shot_verdict"],
            "ours, fine-tuned": [
                signed(r["metric"], r["fine_tuned"], r["fine_tuned_lo"], r["fine_tuned_hi"])
                for _, r in claims.iterrows()
            ],
            "verdict (fine-tuned)": claims["fine_tuned_verdict"],
            "fine-tuned, near / far OOD": near_far_verdicts(claims, "fine_tuned"),
        }
    )


def fusion_cost_section(tables: Mapping[str, pd.DataFrame], setup: dict) -> list[str]:
    cost = tables["table7_cost"]
    config = setup["config"]
    return [
        "## Fused vs separately run members (Table 11)",
        "",
        f"Each fused model against its members run one by one (probabilities averaged), on "
        f"{config['fusion_check']} report sentences: `max |Δp|` is the largest difference of the "
        "two ensembles' probabilities, `changed predictions` the sentences whose predicted class "
        "differs. Float error for zero-shot members (they share their MLPs); for fine-tuned "
        "members the effect of averaging their top layers' MLPs.",
        "",
        markdown_table(tables["fusion_check"]),
        "",
        "## Cost (Table 7, Figure 3)",
        "",
        f"Parameters as stored (shared ones once: Deep Ensembles (D) stores one encoder and "
        f"{setup['members']} heads); multiply-adds and latency for a batch of "
        f"{config['latency_batch']} report sentences at their own length (latency: median of "
        f"{config['latency_repeats']} round-robin calls, ms, on {setup['device']}; bf16 only on "
        "CUDA). The paper reports Hydra near the single model's time in half precision on a GPU "
        "and Deep Ensembles at about three times; a small model on a CPU need not behave the "
        "same.",
        "",
        markdown_table(cost_columns(cost)),
        "",
        "Training runs (Deep Ensembles' members, and fine-tuning after pruning; `seed`: the "
        "training seed, batch order and dropout, and for Deep Ensembles also the classifier's "
        "initialisation; every member is fine-tuned with the same seed, so members differ by "
        "their heads alone):",
        "",
        markdown_table(tables["training"]),
        "",
    ]


def _repeats_sentence(repeats: pd.DataFrame | None) -> list[str]:
    """How many repeats the verdicts are taken over, and what that means for the intervals."""
    n = 1 if repeats is None else int(repeats["repeat"].nunique())
    if n == 1:
        return [
            "One run: the intervals carry the sentences' variance only, not the seeds'.",
            "",
        ]
    return [
        f"Over {n} repeats (each with its own search subsample and three searches, pruning seeds "
        "and fine-tuning seed; the report sentences stay): each difference is the mean of the "
        "repeats' paired differences, its interval over repeats and sentences, so a verdict "
        f"holds across the seeds or is not issued. {INTERVAL_METHOD} A statement over all OOD "
        "sets is judged on the near and the far sets apart too. Every repeat's rows are in "
        "`repeats.csv`.",
        "",
    ]
