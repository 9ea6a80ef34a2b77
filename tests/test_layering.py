"""The engine's import graph: no circles, and no module importing from a layer above its own.

Imports inside functions count too: a lazy import is still a dependency, only a later one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import hydra_core

PACKAGE_DIR = Path(hydra_core.__file__).parent

#: lowest first; a module may import from its own layer and the layers below
LAYERS = (
    (
        "hydra_core.types",
        "hydra_core.paths",
        "hydra_core.errors",
        "hydra_core.files",
        "hydra_core.lazy",
        "hydra_core.outputs",
        "hydra_core.hub",
        "hydra_core.distributed",
    ),
    ("hydra_core.cache", "hydra_core.metrics"),
    ("hydra_core.data",),
    ("hydra_core.inference",),
    ("hydra_core.models", "hydra_core.masks"),
    ("hydra_core.detectors",),  # pytorch-ood's OOD detectors on logits and features
    ("hydra_core.evaluate",),
    ("hydra_core.training",),
    # the named models (one record each: loader, options, training recipe) and load_model for
    # every model source; fused Hydra files are a kind of source hydra/ registers
    ("hydra_core.zoo",),
    ("hydra_core.analysis",),
    # the System protocol and the Run a system evaluates itself through: every system's base
    ("hydra_core.experiment.systems", "hydra_core.experiment.run"),
    ("hydra_core.hydra",),
    ("hydra_core.ood_scores",),  # systems' evaluations under every OOD score
    ("hydra_core.baselines",),
    ("hydra_core.export",),  # fused and pruned models as ONNX; masks for nnsight and as JSON
    # the rest of the experiment layer: evaluate_systems, the results tables, the pipeline
    ("hydra_core.experiment",),
    ("hydra_core.report",),
    ("hydra_core.cli", "hydra_core.__main__"),
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> set[str]:
    """Every hydra_core module that ``module`` imports, at any depth of its code."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("hydra_core")}


def _graph() -> dict[str, set[str]]:
    modules = {
        _module_name(p): p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts
    }
    graph = {}
    for name, path in modules.items():
        if name == "hydra_core":
            continue  # the facade of lazy public exports, above everything
        targets = set()
        for imported in _imports(path, name):
            # `from hydra_core.x import y` names module x.y when it exists, else x
            while imported not in modules and "." in imported:
                imported = imported.rpartition(".")[0]
            if imported in modules and imported not in (name, "hydra_core"):
                targets.add(imported)
        graph[name] = targets
    return graph


def _layer(module: str) -> int:
    """The layer of the most specific entry of LAYERS that names ``module`` or a parent."""
    found = [
        (len(p), rank)
        for rank, prefixes in enumerate(LAYERS)
        for p in prefixes
        if module == p or module.startswith(p + ".")
    ]
    if not found:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in {__file__}")
    return max(found)[1]


GRAPH = _graph()


def test_every_module_has_a_layer():
    for module in GRAPH:
        _layer(module)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_upward_import(module):
    upward = sorted(t for t in GRAPH[module] if _layer(t) > _layer(module))
    assert not upward, f"{module} imports from a higher layer: {upward}"


def test_no_import_circle():
    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in GRAPH.get(node, ()):
                if nxt == start:
                    return [*path, start]
                # a package importing its own submodules is how packages work, not a circle
                if nxt not in seen and not nxt.startswith(start + "."):
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    circles = {tuple(c) for m in GRAPH if (c := cycle_from(m))}
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in sorted(circles))


def test_engine_never_imports_the_app():
    for path in PACKAGE_DIR.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        bad = {n for n in names if n.split(".")[0] in ("streamlit", "hydra_ui", "pages")}
        assert not bad, f"{path} imports {sorted(bad)}"


# --- no name of a family or modality above the seam ---------------------------------------------

REPO_DIR = PACKAGE_DIR.parent
#: where a family's or modality's name may be compared: the seam and the shipped models
SEAM_DIRS = ("hydra_core/models/", "hydra_core/zoo/")


def _names_compared() -> str:
    from hydra_core.models.adapter import FAMILIES
    from hydra_core.models.modality import MODALITIES

    names = sorted({f.name for f in FAMILIES} | set(MODALITIES))
    return "|".join(re.escape(n) for n in names)


_NAME = rf"""["'](?:{_names_compared()})["']"""
#: a line that compares with a family's or modality's name: `x == "text"`, `"vit" != x`,
#: `x in ("image", ...)`, against a family-name constant (`== TEXT_FAMILY`) or a modality
#: object (`is TEXT_MODALITY`), or asks `is_text`
NAME_COMPARISON = re.compile(
    rf"(?:==|!=)\s*{_NAME}|{_NAME}\s*(?:==|!=)|\bin\s*[(\[{{][^)\]}}]*{_NAME}"
    r"|(?:==|!=|\bis\b(?:\s+not)?)\s*\w*(?:_FAMILY|_MODALITY)\b|\w+_FAMILY\s*(?:==|!=)"
    r"|\bis_text\b"
)
#: a loop's ``for x in``, which is no membership test
FOR_IN = re.compile(r"\bfor\s+[\w\s,()]+?\s+in\b")
#: the comparisons left above the seam, (file, line) -> why; each goes when its file asks the
#: family or the modality for what it needs (a property, a method) instead
NAME_COMPARISONS_ALLOWED = {
    ("hydra_core/report/text.py", "if loaded.modality is not TEXT_MODALITY:"): "the text report "
    "is a text task (Table 2): it refuses a model of another modality",
    ("hydra_core/cli/hydra.py", 'if args.task == "text":'): "a report's name (--task text), "
    "not a model's modality",
    ("hydra_core/report/run.py", "if loaded.modality is not IMAGE_MODALITY:"): "the image "
    "report is an image task (Table 1): it refuses a model of another modality",
}


def _name_comparisons() -> dict[tuple[str, str], int]:
    """Each line above the seam that compares a family's or modality's name, (file, line) ->
    how often it occurs."""
    engine = PACKAGE_DIR.rglob("*.py")
    files = [
        *(p for p in engine if not str(p.relative_to(REPO_DIR)).startswith(SEAM_DIRS)),
        *(REPO_DIR / "hydra_ui").rglob("*.py"),
        *(REPO_DIR / "pages").rglob("*.py"),
        REPO_DIR / "app.py",
    ]
    found: dict[tuple[str, str], int] = {}
    for path in files:
        for line in path.read_text().splitlines():
            code = line.strip()
            if code.startswith("#") or not NAME_COMPARISON.search(FOR_IN.sub("for", code)):
                continue
            key = (str(path.relative_to(REPO_DIR)), code)
            found[key] = found.get(key, 0) + 1
    return found


def test_no_family_or_modality_name_is_compared_above_the_seam():
    found = _name_comparisons()
    new = sorted(k for k in found if k not in NAME_COMPARISONS_ALLOWED)
    assert not new, (
        "these lines compare a family's or modality's name outside hydra_core/models/: ask the "
        "family, the modality (loaded.modality: noun, takes_files, benchmark(), ...) or the "
        "loaded model instead, or add a property there:\n"
        + "\n".join(f"{path}: {line}" for path, line in new)
    )


def test_every_allowed_name_comparison_is_still_there():
    """The allow-list only shrinks: an entry whose line is gone must leave the list too."""
    found = _name_comparisons()
    stale = sorted(k for k in NAME_COMPARISONS_ALLOWED if k not in found)
    assert not stale, "allowed comparisons no longer in the code, remove them:\n" + "\n".join(
        f"{path}: {line}" for path, line in stale
    )


#: the longest a source file of the engine or the app may be
MAX_LINES = 800


def test_no_source_file_is_longer_than_800_lines():
    files = [
        *PACKAGE_DIR.rglob("*.py"),
        *(REPO_DIR / "hydra_ui").rglob("*.py"),
        *(REPO_DIR / "pages").rglob("*.py"),
        REPO_DIR / "app.py",
    ]
    long = {
        str(p.relative_to(REPO_DIR)): n
        for p in files
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these files (at most {MAX_LINES} lines each): {long}"


# --- no named model's name and no source prefix above the zoo -----------------------------------


def _model_names() -> tuple[set[str], set[str], set[str]]:
    """The names that say which model a source is: every named model's name and aliases (and the
    ``--base`` of its recipe), the source prefixes (``openclip:``, ``hf:``, ``timm:``), and the
    zoo's constants that hold one of them (``minilm.NAME``, ``DEFAULT_NAME``, ...)."""
    import importlib
    import pkgutil

    import hydra_core.zoo
    from hydra_core.zoo import sources
    from hydra_core.zoo.named import named_models

    names = {n for m in named_models() for n in m.names}
    names |= {m.recipe.base for m in named_models() if m.recipe is not None and m.recipe.base}
    prefixes = {k.prefix for k in vars(sources).values() if isinstance(k, sources.PrefixedSource)}
    constants = set()
    for info in pkgutil.iter_modules(hydra_core.zoo.__path__):
        module = importlib.import_module(f"hydra_core.zoo.{info.name}")
        constants |= {
            key
            for key, value in vars(module).items()
            if key.isupper() and isinstance(value, str) and value in names | prefixes
        }
    return names, prefixes, constants


MODEL_NAMES, SOURCE_PREFIXES, NAME_CONSTANTS = _model_names()
#: the methods whose string argument dispatches on a source's text
PREFIX_METHODS = {"startswith", "endswith", "removeprefix", "removesuffix"}


def _literal(node: ast.AST) -> str | None:
    """A model name or source prefix that ``node`` spells: a string equal to one, or an f-string
    that begins with a prefix (``f"hf:{name}"``); None for any other node."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value in MODEL_NAMES | SOURCE_PREFIXES:
            return node.value
        return next((p for p in SOURCE_PREFIXES if node.value.startswith(p)), None)
    if isinstance(node, ast.JoinedStr) and node.values:
        return _literal(node.values[0])
    return None


def model_name_uses(code: str) -> list[str]:
    """What in ``code`` (a module's text) picks a model by its name or a source by its prefix:
    such a name compared (``==``, ``in``), a key, value or item of a table (a dict, tuple, list
    or set display), a subscript, a match case, the argument of ``startswith`` and the like, an
    f-string that makes a source from its prefix, or a zoo constant that holds a name
    (``minilm.NAME``, ``OPENCLIP_PREFIX``). A name as a default value (``model: str =
    "default"``) or inside a message is none of these."""
    found = []
    tree = ast.parse(code)
    for node in ast.walk(tree):
        spelled: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            spelled = [node.left, *node.comparators]
            spelled += [e for c in node.comparators if hasattr(c, "elts") for e in c.elts]
            spelled += [k for c in node.comparators if isinstance(c, ast.Dict) for k in c.keys]
        elif isinstance(node, ast.Dict):
            spelled = [*(k for k in node.keys if k is not None), *node.values]
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            spelled = list(node.elts)
        elif isinstance(node, ast.Subscript):
            spelled = [node.slice]
        elif isinstance(node, ast.MatchValue):
            spelled = [node.value]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in PREFIX_METHODS:
                spelled = list(node.args)
        elif isinstance(node, ast.JoinedStr) and (name := _literal(node)):
            found.append(f"f-string made from {name!r} (line {node.lineno})")
        elif isinstance(node, ast.Attribute) and node.attr in NAME_CONSTANTS:
            found.append(f"{node.attr} (line {node.lineno})")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hydra_core"):
            found += [
                f"import of {a.name} (line {node.lineno})"
                for a in node.names
                if a.name in NAME_CONSTANTS
            ]
        found += [
            f"{name!r} (line {n.lineno})"
            for n in spelled
            if isinstance(n, ast.Constant) and (name := _literal(n))
        ]
    return sorted(set(found))


def _upper_floor_files() -> list[Path]:
    """The engine's modules in the layers above hydra_core/zoo/ (the layers below cannot ask it:
    hub.py reads ``--model`` before anything is imported), and the app."""
    zoo = _layer("hydra_core.zoo")
    return [
        *(
            p
            for p in PACKAGE_DIR.rglob("*.py")
            if (m := _module_name(p)) in GRAPH and _layer(m) > zoo
        ),
        *(REPO_DIR / "hydra_ui").rglob("*.py"),
        *(REPO_DIR / "pages").rglob("*.py"),
        REPO_DIR / "app.py",
    ]


def test_no_model_name_or_source_prefix_is_used_above_the_zoo():
    found = {
        str(path.relative_to(REPO_DIR)): uses
        for path in _upper_floor_files()
        if (uses := model_name_uses(path.read_text()))
    }
    assert not found, (
        "these files pick a model by its name or a source by its prefix outside hydra_core/models/ "
        "and hydra_core/zoo/: ask the model's record (hydra_core.zoo.named: named_model(source), "
        "its modality, options, recipe) or the source's kind (hydra_core.zoo.sources: "
        "is_zero_shot, OPENCLIP.name_of, ...) instead, or add what you need there:\n"
        + "\n".join(f"{path}: {', '.join(uses)}" for path, uses in sorted(found.items()))
    )


@pytest.mark.parametrize(
    "planted",
    [
        'if source.startswith("openclip:"):\n    pass',
        'if model == "minilm-sentiment":\n    pass',
        'if model in ("dinov2-s", "dinov2"):\n    pass',
        'SOURCES = {"Embedded default": "default"}',
        'TASKS = {"image": "default"}',
        'name = config.model.removeprefix("hf:")',
        'source = f"openclip:{name}"',
        'if args.base == "mpnet":\n    pass',
        "from hydra_core.zoo.minilm import NAME",
        "is_minilm = loaded.name == minilm.NAME",
        "from hydra_core.zoo.registry import OPENCLIP_PREFIX",
        'caption = BUILTIN_MODELS["dinov2-s"]',
    ],
)
def test_a_planted_model_name_or_prefix_is_found(planted):
    assert model_name_uses(planted), planted


@pytest.mark.parametrize(
    "allowed",
    [
        'model: str = "default"',  # a default value picks nothing
        'p.add_argument("--model", default="default")',
        'raise InputError("--prompts applies to OpenCLIP models (--model openclip:...)")',
        "help = \"'default', 'dinov2-s' or a timm name\"",
        "if is_zero_shot(source):\n    pass",
        "named = named_model(source)",
    ],
)
def test_what_is_no_model_name_use(allowed):
    assert not model_name_uses(allowed), allowed


#: the longest a file of a report may be: a report is a declaration (its configuration, its
#: systems, its claims, its tables) over hydra_core/experiment/, its Markdown written by the one
#: writer of hydra_core/report/markdown.py
MAX_REPORT_LINES = 250


def test_no_report_file_is_longer_than_250_lines():
    long = {
        str(p.relative_to(REPO_DIR)): n
        for p in (PACKAGE_DIR / "report").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_REPORT_LINES
    }
    assert not long, (
        f"split these report files (at most {MAX_REPORT_LINES} lines each; the generic part "
        f"belongs in hydra_core/experiment/): {long}"
    )
