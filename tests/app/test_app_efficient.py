"""The Hydra page's block of the paper's efficient ensembles, driven as a user drives it
(AppTest): the command for every copy that is not stored, a stored copy ticked and evaluated
beside Hydra, its predictions those of the stored model."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from hydra_core.baselines import efficient
from hydra_core.baselines.deep_ensembles import recipe_of
from hydra_core.data.benchmark import default_benchmark
from hydra_core.masks import MemberMask
from hydra_core.zoo.registry import load_model
from tests.app.conftest import N_REPORT, N_SEARCH, OOD, button, finish_job, open_page


def test_efficient_block_gives_commands_and_evaluates_a_stored_copy(app, setup, checkpoint):
    # a stored MIMO copy of the checkpoint's recipe (random weights stand in for the training)
    train_config, arch = recipe_of(checkpoint)
    settings = efficient.EfficientSettings()
    path = efficient.scratch_path(efficient.MIMO, settings, train_config, arch)
    torch.manual_seed(0)
    mimo = efficient.build_scratch(efficient.MIMO, arch, settings).eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(mimo.state_dict(), str(path))

    keep = torch.ones(2, 4, dtype=torch.bool)
    first, second = keep.clone(), keep.clone()
    first[0, 0], second[1, 2] = False, False
    members = [MemberMask("a", "test", first), MemberMask("b", "test", second)]
    app.session_state["results"] = {"_setup": setup.key, "jobs": {}, "members": members}
    open_page(app, "pages/6_hydra.py")
    assert not app.error, [e.value for e in app.error]
    captions = [c.value for c in app.caption]
    for method in (efficient.PACKED, efficient.BATCH, efficient.LORA):
        command = f"`python -m hydra_core train-baselines {method} --model {checkpoint}`"
        assert sum(command in c for c in captions) == 1, (method, captions)
    assert not any("train-baselines mimo" in c for c in captions)  # stored: a tick box instead
    box = next(c for c in app.checkbox if c.label.startswith("MIMO ("))
    assert box.label == "MIMO (estimators=3, rho=0.5, batch_repeat=4)" and not box.value
    box.check()
    next(c for c in app.checkbox if c.label == "Temperature scaling").uncheck()
    app.number_input[0].set_value(3)  # timed calls per system: enough for a test
    app.run()
    button(app, "Assemble and evaluate").click()
    app.run()
    finish_job(app, "hydra")
    assert not app.error, [e.value for e in app.error]
    summary = app.dataframe[0].value.set_index("system")
    assert list(summary.index)[-1] == "MIMO"
    assert summary.loc["MIMO", "kind"] == "efficient-ensemble"
    assert summary.loc["MIMO", "heads"] == "8x3"
    report = app.session_state["results"]["hydra"][0]
    benchmark = default_benchmark(n_search=N_SEARCH, n_report=N_REPORT, ood=list(OOD))
    loaded = load_model(checkpoint)
    with torch.no_grad():
        expected = mimo(loaded.preprocess(benchmark.id_report.inputs))
    torch.testing.assert_close(report.evaluations["MIMO"].id.logits, expected)
