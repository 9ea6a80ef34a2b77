"""The greedy search's contract, for every family (``family`` fixture: each tiny ViT
configuration, text kind and OpenCLIP tower configuration): the fast path's candidate logits are
the ablated model's, and the fast search makes the plain search's choices to the last head.

Checks that hold for one family only stay in its file: test_greedy.py (ViTs, and timm
configurations only the fast path's refusals see), test_text_search.py, test_openclip_family.py
(zero-shot classifiers)."""

from __future__ import annotations

import pytest
import torch

from hydra_core.analysis._suffix import SuffixEvaluator
from hydra_core.analysis.greedy import greedy_circuit
from hydra_core.models.adapter import ablate
from tests.analysis.test_greedy import assert_same_search
from tests.conftest import FAMILY_IDS
from tests.families import DEPTH, HEADS

#: the whole searches run on every ViT configuration and text kind and on one OpenCLIP tower (a
#: tower's search costs about 11 s on one core; the candidate logits above check every tower)
SEARCHED = [f for f in FAMILY_IDS if not f.startswith("openclip-") or f == "openclip-plain"]


def test_fast_candidate_logits_match_ablated_forward_in_float32(family):
    model = family.build()
    batch = family.batch(12)
    removed = [(0, 1), (1, 0), (1, 2), (2, 3), (2, 0), (2, 2)]  # layer 2 keeps one head
    keep = torch.ones(DEPTH, HEADS, dtype=torch.bool)
    for layer, head in removed:
        keep[layer, head] = False
    with torch.inference_mode():
        evaluator = SuffixEvaluator(model, family.inputs(batch), pairs_per_pass=3)
        evaluator.set_removed(removed)
        with ablate(model, keep):
            torch.testing.assert_close(
                evaluator.logits, family.run(model, batch), rtol=1e-5, atol=1e-5
            )
        seen = []
        for heads, logits in evaluator.candidate_logits():
            for (layer, head), got in zip(heads, logits, strict=True):
                one_less = keep.clone()
                one_less[layer, head] = False
                with ablate(model, one_less):
                    torch.testing.assert_close(got, family.run(model, batch), rtol=1e-5, atol=1e-5)
                seen.append((layer, head))
    assert seen == [tuple(h) for h in keep.nonzero().tolist()]


@pytest.mark.parametrize("family", SEARCHED, indirect=True)
def test_fast_equals_plain_full_budget(family):
    """In float64 (in float32 the two paths' logits differ by a few ulps, enough to swap two
    samples whose MSPs lie 1e-8 apart: float noise, not a different algorithm)."""
    model = family.build().double()
    id_x, id_y, ood_x = family.search_data()
    if id_x.is_floating_point():
        id_x, ood_x = id_x.double(), ood_x.double()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modules = list(model.modules())
    runs = [
        greedy_circuit(model, id_x, id_y, ood_x, objective="avg", budget=DEPTH * HEADS, method=m)
        for m in ("fast", "plain")
    ]
    assert_same_search(*runs)
    assert runs[0].complete and runs[0].keep_mask().sum() == 0  # every layer ends without heads
    assert list(model.modules()) == modules  # no part of the model was replaced
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
