"""The docs stay true: the code blocks they mark as tested run as written, every page is in the
site's nav, and the README's links and commands resolve.

A block is tested when the line before its fence is ``<!-- tested: NAME -->`` (hidden on GitHub
and in the site); NAME says which test below runs it. The README's Python example and the Python
page's tour are lines of ``docs/example.py``, which a test runs; the README's example also runs
as written, on the same cache. "Use the results elsewhere" (docs/export.md) runs its commands,
then each Python snippet (the nnsight one in a process of its own, as nnsight patches Python's
``object`` and torch when imported)."""

from __future__ import annotations

import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hydra_core.cli import main
from hydra_core.experiment.results import SUMMARY_METRICS
from hydra_core.zoo.default import DEFAULT_CHECKPOINT
from tests.conftest import missing_data

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
README = REPO / "README.md"
EXAMPLE = DOCS / "example.py"
MARKED = re.compile(r"<!-- tested: ([\w-]+) -->\n```(\w+)\n(.*?)```", re.S)

#: every tested block: name -> the page it is on (a block moved to another page moves here too)
TESTED = {
    "readme-example": "README.md",
    "python-tour": "docs/python.md",
    "export-commands": "docs/export.md",
    "onnx-runtime": "docs/export.md",
    "text-onnx": "docs/export.md",
    "nnsight": "docs/export.md",
    "plain-json": "docs/export.md",
    "text-ablate": "docs/text.md",
    "named-model": "docs/architecture.md",
}


def marked_blocks() -> dict[str, tuple[str, str, str]]:
    """name -> (page, language, code) of every marked block in the README and docs/."""
    blocks: dict[str, tuple[str, str, str]] = {}
    for page in [README, *sorted(DOCS.rglob("*.md"))]:
        for name, lang, code in MARKED.findall(page.read_text()):
            assert name not in blocks, f"two blocks are marked {name!r}"
            blocks[name] = (page.relative_to(REPO).as_posix(), lang, code)
    return blocks


def block(name: str) -> str:
    return marked_blocks()[name][2]


def test_every_marked_block_is_tested_and_every_tested_block_is_marked():
    found = {name: page for name, (page, _, _) in marked_blocks().items()}
    assert found == TESTED


def code_lines(text: str) -> set[str]:
    """The code of every line, without indentation and trailing comments."""
    code = (line.split("  #")[0].strip() for line in text.splitlines())
    return {line for line in code if line and not line.startswith("#")}


@pytest.mark.parametrize("name", ["readme-example", "python-tour"])
def test_python_block_is_the_tested_script(name):
    """Every line of code of the block is in docs/example.py (comments aside, and the lines that
    only show what to look at, which the script prints), so running the script checks it."""
    script = code_lines(EXAMPLE.read_text())
    missing = [
        line
        for line in code_lines(block(name))
        if not line.startswith(("search.labels()", "report.summary()", "member_logits = hydra("))
        and line not in script
    ]
    assert not missing, f"{name} lines not in docs/example.py: {missing}"


def test_readme_example_is_short():
    """The README's example stays a few lines of code; the tour is docs/python.md."""
    lines = [line for line in block("readme-example").splitlines() if line.strip()]
    assert len(lines) <= 16


@pytest.mark.skipif(not DEFAULT_CHECKPOINT.exists(), reason="needs the shipped checkpoint")
def test_example_runs_and_the_readme_example_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HYDRA_LAB_CACHE", str(tmp_path))  # a cold cache: every step really runs
    namespace = runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    search, report = namespace["search"], namespace["report"]
    assert len(search.order) == 6 and len(search.scores) == 6
    assert namespace["member_logits"].shape == (8, 3, 10)
    summary = report.summary()
    assert {"single", "Hydra (fused)", "Hydra (unfused)"} <= set(summary["system"])
    fused = summary.set_index("system").loc["Hydra (fused)"]
    unfused = summary.set_index("system").loc["Hydra (unfused)"]
    assert fused["accuracy"] == pytest.approx(unfused["accuracy"], abs=1e-6)  # zero-shot: equal
    assert "removed:" in out and "Hydra (fused)" in out
    baselines = set(summary["system"])  # the last report: Hydra beside the baselines
    assert {"Temperature Scaling", "MC Dropout (p=0.1, post hoc)"} <= baselines

    # The README's block as written, on the same cache (its search and predictions are the
    # script's): the same search, and the same metrics for the systems both evaluate (the
    # latency columns are timed again).
    readme: dict = {}
    exec(block("readme-example"), readme)
    printed = capsys.readouterr().out
    assert readme["search"].order == search.order
    mine = readme["report"].summary()
    assert printed == mine.round(4).to_string() + "\n"
    metrics = [c for c in SUMMARY_METRICS if c in mine]
    for name in ("single", "Hydra (fused)", "Hydra (unfused)"):
        ours = mine.set_index("system").loc[name, metrics].astype(float)
        script = summary.set_index("system").loc[name, metrics].astype(float)
        np.testing.assert_allclose(ours, script, rtol=0, atol=1e-12, err_msg=name)


# --- docs/export.md, "Use the results elsewhere" -----------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder where the page's commands have run (mask file, ONNX files, exported masks)."""
    if not DEFAULT_CHECKPOINT.exists():
        pytest.skip("needs the shipped checkpoint")
    folder = tmp_path_factory.mktemp("elsewhere")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setenv("HYDRA_LAB_CACHE", str(folder / "cache"))
        for line in block("export-commands").splitlines():
            argv = shlex.split(line.split("  #")[0])
            assert argv[:3] == ["python", "-m", "hydra_core"], line
            assert main(argv[3:]) == 0, line
    return folder


def test_the_export_page_has_one_command_block():
    page = (DOCS / "export.md").read_text()
    assert len(re.findall(r"```bash\n", page)) == 1


def test_the_commands_write_every_file(workdir):
    for name in ("members.json", "hydra.onnx", "member0.onnx", "hydra_masks.py"):
        assert (workdir / name).is_file(), name
    assert (workdir / "members_plain.json").read_text().startswith('{\n  "Taylor seed 0"')


def test_onnx_runtime_snippet_preprocesses_as_hydra_lab(workdir, monkeypatch, capsys):
    from hydra_core.zoo.registry import load_model

    monkeypatch.chdir(workdir)
    namespace: dict = {}
    exec(block("onnx-runtime"), namespace)
    assert namespace["member_logits"].shape == (8, 3, 10) and namespace["probs"].shape == (8, 10)
    loaded = load_model("default")
    expected = loaded.preprocess(torch.from_numpy(namespace["images"]))
    np.testing.assert_allclose(namespace["x"], expected.numpy(), rtol=0, atol=1e-6)
    assert "Taylor seed 0" in capsys.readouterr().out


def test_nnsight_snippet_runs_and_its_assert_holds(workdir):
    out = subprocess.run(
        [sys.executable, "-c", block("nnsight")],
        cwd=workdir,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "HYDRA_LAB_CACHE": str(workdir / "cache")},
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_plain_json_snippet_reads_the_masks_back(workdir, monkeypatch):
    from hydra_core.masks import load_masks
    from hydra_core.models.adapter import head_layout
    from hydra_core.zoo.registry import load_model

    monkeypatch.chdir(workdir)
    namespace: dict = {}
    exec(block("plain-json"), namespace)
    loaded = load_model("default")
    members = load_masks("members.json", head_layout(loaded.model), loaded.identity())
    assert list(namespace["masks"]) == [m.name for m in members]
    for member in members:
        assert torch.equal(namespace["masks"][member.name], member.keep)


def minilm_or_skip() -> None:
    from hydra_core.errors import InputError
    from hydra_core.zoo.minilm import wheel_folder

    try:
        wheel_folder()
    except InputError as error:
        missing_data(str(error))


def test_text_onnx_snippet(tmp_path, monkeypatch):
    minilm_or_skip()
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(block("text-onnx"), namespace)
    assert namespace["member_logits"].shape == (2, 2, 2)
    hydra, batch = namespace["hydra"], namespace["batch"]
    with torch.no_grad():
        expected = hydra(
            input_ids=torch.from_numpy(batch["input_ids"]),
            attention_mask=torch.from_numpy(batch["attention_mask"]),
        )
    np.testing.assert_allclose(namespace["member_logits"], expected.numpy(), rtol=0, atol=1e-5)


# --- docs/text.md ------------------------------------------------------------------------------


def test_text_page_snippet_runs_and_its_assert_holds(capsys):
    """Switched-off heads, the structurally pruned copy (its assert) and the fused HydraText."""
    minilm_or_skip()
    namespace: dict = {}
    exec(block("text-ablate"), namespace)
    assert tuple(namespace["member_logits"].shape) == (2, 2, 2)
    model, keep, batch = namespace["model"], namespace["keep"], namespace["batch"]
    for m, member_keep in enumerate([keep, ~keep]):
        from hydra_core import ablate

        with ablate(model, member_keep), torch.no_grad():
            expected = model(**batch).logits
        torch.testing.assert_close(namespace["member_logits"][:, m], expected, rtol=0, atol=1e-5)
    assert "torch.Size([2, 2, 2])" in capsys.readouterr().out


# --- the site and the README's links -----------------------------------------------------------


def nav_pages() -> list[str]:
    """The pages named in mkdocs.yml's nav, in order."""
    import yaml  # PyYAML, a dependency of mkdocs

    def walk(entry) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [page for item in entry for page in walk(item)]
        return [page for value in entry.values() for page in walk(value)]

    return walk(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])


def test_every_docs_page_is_in_the_nav():
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    nav = nav_pages()
    assert len(nav) == len(set(nav)), "a page is twice in the nav"
    assert sorted(set(pages) - set(nav)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(nav) - set(pages)) == [], "nav entries without a page"


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (code marks and punctuation dropped, spaces to '-')."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {github_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    return [link for link in links if not re.match(r"[a-z]+:", link)]


@pytest.mark.parametrize(
    "page", [README, *sorted(DOCS.rglob("*.md"))], ids=lambda p: p.relative_to(REPO).as_posix()
)
def test_links_resolve(page):
    """Every relative link names a file that exists, and its anchor a heading of that page
    (the site's strict build checks the docs pages' links too; this also covers the README)."""
    broken = []
    for link in relative_links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(link)
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(link)
    assert not broken, f"{page.name}: links that do not resolve: {broken}"


def test_readme_commands_are_the_makefile_and_ci():
    """The README's two commands are Makefile targets, its test command is what CI runs, and
    `make test` builds the docs strictly (a broken doc fails CI)."""
    readme = README.read_text()
    commands = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    targets = [line.split("#")[0].split() for line in commands.splitlines()]
    assert targets == [["make", "run"], ["make", "test"]]
    makefile = (REPO / "Makefile").read_text()
    for target in ("run", "test", "docs"):
        assert re.search(rf"^{target}:", makefile, re.M), target
    test_recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    build = re.search(r"(mkdocs|\$\(MKDOCS\)) build --strict.*", test_recipe)
    assert build, "make test must build the docs strictly"
    assert not re.search(r"--quiet|\s-q\b", build.group(0)), "--quiet hides strict's warnings"
    assert re.search(r"^MKDOCS := .*mkdocs$", makefile, re.M)
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_readme_fits_a_few_screens():
    assert len(README.read_text().splitlines()) <= 300
