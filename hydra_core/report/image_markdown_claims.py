"""The image report's ``report.md``: the summary of the paper's headline statements, then the
statements in full, those judged over the repeats and those about the efficient ensembles,
judged on repeat 0 (one stored copy each), with the ensembles not run listed as not judged."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from hydra_core.report.claims import near_far_verdicts, signed, verdict_tally
from hydra_core.report.efficient_ensembles import judged
from hydra_core.report.markdown import headline, markdown_table
from hydra_core.report.transfer import transfer_lines

#: the paper's headline statements about its Table 1, summarised first (those about the
#: efficient ensembles follow, one per ensemble that ran)
HEADLINES = (
    "Hydra (Circ) raises OOD AUROC over Single",
    "Hydra (Circ) raises accuracy over Single",
    "Hydra (Circ) raises OOD AUROC over Deep Ensembles",
    "Hydra (Circ) raises OOD AUROC over Hydra (Taylor)",
    "Deep Ensembles raises OOD AUROC over Single",
    "CircAvg raises OOD AUROC over Taylor",
)


def summary_section(tables: Mapping[str, pd.DataFrame], repeats: int) -> list[str]:
    """The paper's headline statements against this run (over the ``repeats``; then Hydra
    (Circ) against each efficient ensemble that ran, on repeat 0), every OOD one with its near
    and far verdict; the verdict counts; and where the circuits' OOD gain transferred."""
    claims = tables.get("paper_claims")
    if claims is None or claims.empty:
        return []
    over, efficient = judged(claims, repeat_0=False), judged(claims, repeat_0=True)
    rows = over.set_index("claim", drop=False)
    how = f"mean of {repeats} repeats"
    lines = [
        headline(rows.loc[c], "ours", "verdict", how)
        for c in HEADLINES
        if c in rows.index and rows.loc[c, "verdict"] != "–"
    ]
    if efficient is not None:
        lines += [
            headline(r, "ours", "verdict", "repeat 0")
            for _, r in efficient.iterrows()
            if r["metric"] == "all_auroc" and r["verdict"] != "–"
        ]
    counts = [
        (f"over the {repeats} repeats", over),
        ("the efficient ensembles, repeat 0", efficient),
    ]
    for label, frame in counts:
        if frame is not None and (tally := verdict_tally(frame["claim"], frame["verdict"])):
            lines.append(f"- **{label}**: of {tally}")
    transfer = tables.get("transfer")
    if transfer is not None and not transfer.empty:
        lines += [
            "- **Does the circuits' OOD gain reach sets the search never saw?** AUROC change "
            "against the dense model (x100), near and far report sets apart:",
            *(f"  {line}" for line in transfer_lines(transfer)),
        ]
    return [
        "## Summary: the paper's statements against this run",
        "",
        "Differences in points for accuracy and OOD metrics; ours with the paired 95% interval "
        "(over the repeats: the two-level interval; the efficient ensembles: repeat 0 alone). "
        "The full lists are in the sections on the paper's statements below.",
        "",
        *lines,
        "",
    ]


def claims_sections(
    claims: pd.DataFrame | None, repeats: int, setup: Mapping | None = None
) -> list[str]:
    """The statements over the ``repeats``, then those about the efficient ensembles
    (``setup["efficient_ensembles"]`` says which were not run)."""
    return [
        *_claims_section(judged(claims, repeat_0=False), repeats),
        *_efficient_claims_section(judged(claims, repeat_0=True), setup),
    ]


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


def _efficient_claims_section(claims: pd.DataFrame | None, setup: Mapping | None) -> list[str]:
    """The paper's statements comparing Hydra (Circ) with the efficient ensembles that ran, on
    repeat 0 with the items' interval; the ensembles not run are listed as not judged."""
    facts = (setup or {}).get("efficient_ensembles") or {}
    not_run = list(facts.get("not_run", {}))
    if (claims is None or claims.empty) and not not_run:
        return []
    lines = ["## The paper's statements about the efficient ensembles (repeat 0)", ""]
    if claims is not None and not claims.empty:
        shown = pd.DataFrame(
            {
                "the paper says (ImageNet-1K, Table 1)": claims["claim"],
                "paper": [f"{v:+.2f}" for v in claims["paper_difference"]],
                "ours, repeat 0": [
                    signed(m, v, lo, hi)
                    for m, v, lo, hi in claims[["metric", "ours", "ours_lo", "ours_hi"]].itertuples(
                        index=False
                    )
                ],
                "verdict": claims["verdict"],
                "verdict, near / far OOD": near_far_verdicts(claims, "ours"),
            }
        )
        lines += [
            "Hydra (Circ) (fine-tuned, as above) minus each efficient ensemble in the paper's "
            'Table 1 ("Compared with [...] adapter-based methods and other efficient ensembles, '
            'Hydra Ensembles achieves better robustness", 5.1). Each efficient ensemble is one '
            "stored copy, not seeded per repeat, so these are judged on repeat 0 alone: the "
            "paired difference with its 95% bootstrap interval over the report images, without "
            "the seeds' variance (`paper_claims.csv`, `judged_on`). Verdicts as above.",
            "",
            markdown_table(shown),
            "",
            f"Of {verdict_tally(claims['claim'], claims['verdict'])}",
            "",
        ]
    if not_run:
        lines += [
            f"Not judged (not run, see the setup): the statements about {', '.join(not_run)}.",
            "",
        ]
    return lines
