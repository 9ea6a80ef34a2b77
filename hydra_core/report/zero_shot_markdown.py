"""The zero-shot report's ``report.md`` (:func:`zero_shot_markdown`), written from its tables
and setup alone."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from hydra_core.report.claims import near_far_verdicts, paper_frame, signed, verdict_counts
from hydra_core.report.markdown import markdown_table, searches_line
from hydra_core.report.zero_shot_config import DEFAULT_COMMAND


def zero_shot_markdown(tables: Mapping[str, pd.DataFrame], setup: dict) -> str:
    """``report.md`` from the tables and the setup."""
    model, b = setup["model"], setup["budgets"]
    p = setup["protocol"]
    circuit = tables["circuit"].iloc[0]
    lines = [
        "# Hydra Ensembles, zero-shot CLIP: the paper's Table 3",
        "",
        f"Generated {setup['created']} by `{setup['command'] or DEFAULT_COMMAND}` in "
        f"{setup['total_seconds'] / 60:.1f} minutes on {setup['machine']} ({setup['device']}). "
        "Every number below was measured by this run, except the paper's, which are labelled.",
        "",
        *random_weights_warning(setup),
        "## Setup",
        "",
        f"- **Model**: `{model['name']}`: {setup['model_description']}; head layout "
        f"{str(model.get('towers', '')).partition(': ')[2] or model['layers']} (head dim "
        f"{model['head_dim']}, image width {model['embed_dim']}).",
        f"- **Classifier**: zero-shot, {len(setup['classes'])} classes from the ID set, "
        f"prompt templates {', '.join(repr(t) for t in setup['templates'])}; logits = logit "
        f"scale x cosine of the image and class embeddings. {_towers_sentence(setup)} Nothing "
        "is trained.",
        f"- **Data**: heads are selected, and the temperature ({setup['temperature']:.4f}) is "
        f"fitted, on {p['id_search_n']:,} ID search images and the search OOD set(s) "
        f"{', '.join(p['search_ood'])}; every table is computed on {p['id_report_n']:,} ID report "
        f"images and the report OOD sets {', '.join(p['report_ood'])}, with 95% bootstrap "
        "intervals (value [lo, hi]) and paired intervals for differences.",
        *searches_line(p, stability=False),
        f"- **Budgets**: every pruned model and member removes {b['budget']} of {b['total']} "
        f"heads; Taylor {_taylor_counts(b['removed_per_layer'], setup)}; CircAvg the greedy "
        "S_avg circuit. Hydra (Circ) is the paper's method: one circuit per criterion (CircAcc, "
        "CircOOD, CircAvg, each its own greedy search); Hydra (Taylor)'s members draw from the "
        f"{b['pool']} least useful heads of the Taylor ranking, seeds "
        f"{setup['protocol']['seeds']['pruning']}.",
        "",
        "## Table 3 - every system",
        "",
        markdown_table(tables["table3_systems"]),
        "",
        "The paper's Table 3 (OpenCLIP ViT-B/32, nine data sets averaged, ImageNet-1k as the OOD "
        "set, both towers pruned; ECE as a fraction here), for reference:",
        "",
        markdown_table(paper_frame(tables["paper_table3"])),
        "",
        "## Differences to the single model",
        "",
        markdown_table(tables["differences_to_single"]),
        "",
        "## Agreements and disagreements with the paper",
        "",
        "*agrees*: same direction as the paper's difference, our interval excludes 0; "
        "*disagrees*: opposite direction, interval excludes 0; *n.s.*: our interval contains 0.",
        "",
        markdown_table(_claims_shown(tables["paper_claims"])),
        "",
        *verdict_counts(
            tables["paper_claims"]
            .rename(columns={"verdict": "zero_shot_verdict"})
            .assign(fine_tuned_verdict="–")
        ),
        "",
        "## The CircAvg circuit",
        "",
        f"On the search split it moved accuracy from {100 * circuit['dense_search_accuracy']:.2f} "
        f"to {100 * circuit['search_accuracy']:.2f} and AUROC from "
        f"{100 * circuit['dense_search_auroc']:.2f} to {100 * circuit['search_auroc']:.2f} "
        f"({circuit['seconds']:.0f} s); removed in order: {circuit['removed']}.",
        "",
        "## Near and far OOD",
        "",
        markdown_table(tables["near_far"]),
        "",
        "## Cost",
        "",
        markdown_table(tables["table7_cost"]),
        "",
    ]
    return "\n".join(lines)


def _towers_sentence(setup: Mapping) -> str:
    """Which heads were pruned, against the paper."""
    if setup.get("towers", "image") == "both":
        layers = setup.get("tower_layers", {})
        shown = " + ".join(f"{n} {name}" for name, n in layers.items())
        return (
            f"Heads are pruned jointly in both towers (one head layout of {shown} layers), as "
            "the paper's Table 3 (D.3); each pruned model and member has the class embeddings "
            "of its own pruned text tower."
        )
    return (
        "Heads are pruned in the image tower only (--towers image); the paper's Table 3 prunes "
        "both towers (its Appendix E.3.2 has the image tower alone)."
    )


def _taylor_counts(removed, setup: Mapping) -> str:
    """Taylor's heads per layer: one number (the paper's "10 of 12"), or one per layer."""
    if isinstance(removed, int):
        return f"{removed} per layer of the image tower (the paper's 10 of 12 kept)"
    counts = sorted(set(removed))
    shown = " or ".join(str(c) for c in counts)
    return f"{shown} per layer, spread over the layers of both towers ({sum(removed)} in all)"


def random_weights_warning(setup: Mapping) -> list[str]:
    """A warning at the top when the model's folder says its weights are random."""
    if not setup.get("random_weights"):
        return []
    return [
        f"**The weights of this model are random ({setup['model'].get('weights', '')}): no number "
        "in this report is a zero-shot result. Such a run checks that the pipeline works; only a "
        "run on pretrained weights says anything about the paper.**",
        "",
    ]


def _claims_shown(claims: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "paper says": claims["claim"],
            "paper": [f"{v:+.4g}" for v in claims["paper_difference"]],
            "ours": [
                signed(r["metric"], r["ours"], r["ours_lo"], r["ours_hi"])
                for _, r in claims.iterrows()
            ],
            "verdict": claims["verdict"],
            "verdict, near / far OOD": near_far_verdicts(claims, "ours"),
        }
    )
