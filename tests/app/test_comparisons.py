"""The Hydra page's verdict on the fused ensemble against its best member
(:func:`hydra_ui.comparisons.ensembling_verdict`): near and far apart, and each group's words tied
to the sign of its paired interval (fused minus best member: above 0 is the ensemble's gain)."""

import pandas as pd

from hydra_ui.comparisons import ensembling_verdict


def comparisons(near: tuple, far: tuple, all_: tuple) -> pd.DataFrame:
    """A comparisons table with a baseline row and a best-member row of the given
    (value, lo, hi) per AUROC group."""
    row = {"system": "Hydra (fused)", "against": "Hydra: a", "role": "best member"}
    for column, (value, lo, hi) in (("near_auroc", near), ("far_auroc", far), ("all_auroc", all_)):
        row |= {column: value, f"{column}_lo": lo, f"{column}_hi": hi}
    baseline = {**row, "against": "single", "role": "baseline"}
    return pd.DataFrame([baseline, row])


def test_each_group_gets_the_words_of_its_interval():
    verdict = ensembling_verdict(
        comparisons(near=(0.02, 0.01, 0.03), far=(-0.01, -0.03, 0.01), all_=(-0.04, -0.05, -0.02))
    )
    assert "**Hydra (fused)**" in verdict and "**Hydra: a**" in verdict
    assert "near OOD +0.0200 [+0.0100, +0.0300]" in verdict
    assert "far OOD -0.0100 [-0.0300, +0.0100]" in verdict
    assert "all sets -0.0400 [-0.0500, -0.0200]" in verdict
    assert "beats its best member on near OOD:" in verdict  # interval above 0: the ensembling's
    assert "beats the ensemble on all sets:" in verdict  # below 0: the member alone is better
    assert "Not significant on far OOD:" in verdict  # contains 0


def test_a_gain_everywhere_never_credits_the_pruning():
    verdict = ensembling_verdict(
        comparisons(near=(0.02, 0.01, 0.03), far=(0.05, 0.02, 0.08), all_=(0.03, 0.02, 0.04))
    )
    assert "beats its best member on near OOD, far OOD and all sets:" in verdict
    assert "pruning, not the ensembling" not in verdict


def test_no_best_member_no_verdict():
    table = comparisons(near=(0, -1, 1), far=(0, -1, 1), all_=(0, -1, 1)).iloc[:1]
    assert ensembling_verdict(table) == ""
