"""Masks applied through nnsight against ``hydra_core.ablate``, run in a process of its own.

nnsight patches Python's ``object`` (a ``.save`` on everything) and torch (``Tensor.backward``)
when it is imported, so ``tests/export/test_export_masks.py`` runs this script in a subprocess
instead of importing nnsight into the test session. For each case it prints one JSON line:
``{"case", "library_equal", "module_equal", "changed"}``: the output of the nnsight trace with
the mask applied by :func:`~hydra_core.export.masks.nnsight_ablate` and by the module
``masks export --to nnsight`` writes, each compared bit for bit (``torch.equal``) with the
output under ``ablate``; ``changed``: the mask changes the output at all (so equality means
something). Cases on the embedded defaults are left out, with a line saying so, where their files
are missing.

    python -m tests.export.nnsight_check OUT_FOLDER
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch
from nnsight import NNsight

from hydra_core.export.masks import nnsight_ablate, nnsight_module
from hydra_core.masks import MemberMask
from hydra_core.models.adapter import ablate, head_layout
from tests.conftest import TEXT_KINDS, TINY_CONFIGS, make_tiny_text, make_tiny_vit, text_batch

torch.set_num_threads(1)


def masks_for(layers: int, heads: int, seed: int) -> list[torch.Tensor]:
    """Two members: random heads kept; the second keeps no head in layer 0."""
    g = torch.Generator().manual_seed(seed)
    first = torch.rand(layers, heads, generator=g) < 0.6
    first[:, 0] = True
    second = torch.rand(layers, heads, generator=g) < 0.5
    second[0] = False
    second[-1, -1] = True
    return [first, second]


def load_module(source: str, folder: Path, name: str):
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compare(case: str, model, bare, run, keeps, folder: Path) -> None:
    """``model``: what Hydra Lab holds; ``bare``: the module nnsight wraps; ``run(m)``: the output
    of calling ``m`` (a module or an nnsight wrapper) on the case's inputs."""
    members = [MemberMask(f"member {i}", "test", keep) for i, keep in enumerate(keeps)]
    layout = head_layout(model)
    identity = {"name": case, "layers": layout.num_layers, "heads": layout.max_heads}
    module = load_module(nnsight_module(members, model, identity), folder, case.replace("-", "_"))
    wrapped = NNsight(bare)
    for i, member in enumerate(members):
        with torch.no_grad():
            plain = run(bare)
            with ablate(bare, member.keep):
                expected = run(bare)
            with wrapped.trace(*run.args, **run.kwargs):
                nnsight_ablate(wrapped, model, member)
                through_library = run.output(wrapped).save()
            with wrapped.trace(*run.args, **run.kwargs):
                module.apply(wrapped, member.name if i else 0)
                through_module = run.output(wrapped).save()
        print(
            json.dumps(
                {
                    "case": f"{case} {member.name}",
                    "library_equal": torch.equal(through_library, expected),
                    "module_equal": torch.equal(through_module, expected),
                    "changed": not torch.equal(plain, expected),
                }
            ),
            flush=True,
        )


class Inputs:
    """A model's call on fixed inputs: ``self(m)`` runs it, ``args``/``kwargs`` are what a trace
    takes, ``output(wrapped)`` reads the logits from the traced output."""

    def __init__(self, *args, logits: bool = False, **kwargs) -> None:
        self.args, self.kwargs, self.logits = args, kwargs, logits

    def __call__(self, model):
        out = model(*self.args, **self.kwargs)
        return out.logits if self.logits else out

    def output(self, wrapped):
        return wrapped.output.logits if self.logits else wrapped.output


def main(folder: Path) -> None:
    images = torch.randn(4, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    for name, config in TINY_CONFIGS.items():
        vit = make_tiny_vit(**config)
        compare(f"vit-{name}", vit, vit, Inputs(images), masks_for(3, 4, 0), folder)
    ids, mask = text_batch(0, 6, 12)
    for kind in TEXT_KINDS:
        model = make_tiny_text(kind, depth=3)
        run = Inputs(input_ids=ids, attention_mask=mask, logits=True)
        compare(f"text-{kind}", model, model, run, masks_for(3, 4, 1), folder)
    defaults(folder)


def defaults(folder: Path) -> None:
    """The embedded defaults: the default ViT and minilm-sentiment (its Hugging Face model)."""
    from hydra_core.errors import InputError
    from hydra_core.zoo.registry import load_model

    try:
        vit = load_model("default")
    except (InputError, OSError) as error:
        print(json.dumps({"case": "default", "missing": str(error)}), flush=True)
    else:
        x = vit.preprocess(torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8))
        compare("default", vit.model, vit.model, Inputs(x), masks_for(6, 12, 2), folder)
    try:
        text = load_model("minilm-sentiment")
    except (InputError, OSError) as error:
        print(json.dumps({"case": "minilm-sentiment", "missing": str(error)}), flush=True)
        return
    batch = text.preprocess.tokenizer(
        ["a gorgeous , witty , seductive movie .", "dull and overlong"],
        padding=True,
        return_tensors="pt",
    )
    run = Inputs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], logits=True)
    hf = text.model.hf
    compare("minilm-sentiment", text.model, hf, run, masks_for(6, 12, 3), folder)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
