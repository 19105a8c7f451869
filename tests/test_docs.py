"""The documentation holds together: every relative link in README.md and docs/*.md reaches a
file (and its heading, where it names one), every docs page is reachable from the README and from
docs/architecture.md, every recipe key has its row in docs/recipes.md, and the README's quick
start still holds the two lines CI runs (.ci/run). Reads text only; imports no TensorFlow."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path

from dtcli.recipe import configs

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.glob("*.md")])
FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); the text may run over lines.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(path: Path) -> str:
    """A page without its code blocks, where a `[x](y)` or a `# line` is no link or heading."""
    return FENCE.sub("", path.read_text())


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(_prose(path)):
        base = _anchor(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        anchors.add(base if count == 0 else f"{base}-{count}")
    return anchors


def _links(path: Path) -> list[str]:
    prose = INLINE_CODE.sub(lambda m: "x" * len(m.group()), _prose(path))
    return [t for t in LINK.findall(prose) if not re.match(r"[a-z]+:", t)]


def test_anchor_is_githubs():
    assert _anchor("XLA or DTensor: `train.compile`") == "xla-or-dtensor-traincompile"
    assert _anchor("Tensor parallel on one machine's CPU") == "tensor-parallel-on-one-machines-cpu"
    assert _anchor("The recipes in `recipes/`") == "the-recipes-in-recipes"


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in _links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_linked_from_readme_and_architecture():
    def linked(page: Path) -> set[Path]:
        return {(page.parent / t.partition("#")[0]).resolve() for t in _links(page)}

    pages = {p.resolve() for p in DOCS.glob("*.md")}
    architecture = DOCS / "architecture.md"
    assert pages - linked(ROOT / "README.md") == set()
    assert pages - {architecture.resolve()} - linked(architecture) == set()


def _options(hint: object) -> list[object]:
    """The types a key's value may have: a union's members, None aside; else the type itself."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(hint) if a is not type(None)]
    return [hint]


def _keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted recipe key of a config dataclass that takes a value; a section (a key whose
    every value is a mapping of keys: `train`, `model.transformer`) gives its keys instead."""
    hints = typing.get_type_hints(cls)
    keys = []
    for field in dataclasses.fields(cls):
        key = prefix + field.name
        options = _options(hints[field.name])
        if not all(dataclasses.is_dataclass(o) for o in options):
            keys.append(key)
        for section in (o for o in options if dataclasses.is_dataclass(o)):
            keys += _keys(section, key + ".")
    return keys


def test_every_recipe_key_has_its_row_in_docs_recipes():
    rows = set(re.findall(r"^\| `([\w.]+)` \|", (DOCS / "recipes.md").read_text(), re.MULTILINE))
    keys = _keys(configs.Recipe)
    assert {"seed", "data.tokenizer", "data.tokenizer.vocab_size", "train.compile"} <= set(keys)
    assert "model.transformer" not in keys
    missing = [k for k in keys if k not in rows]
    assert not missing, f"recipe keys without a row in docs/recipes.md's tables: {missing}"


def test_readme_quick_start_holds_the_lines_ci_runs():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"^## Quick start\n\n```\n(.*?)```", readme, re.MULTILINE | re.DOTALL)
    assert block, "README.md: no ``` block right under '## Quick start'"
    install = 'pip install -e ".[test]" && dtcli train recipes/quickstart.yaml'
    assert block.group(1).splitlines() == [install, "pytest -q"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert install in ci and "pytest -q" in ci


def test_the_folders_documented_commands_write_are_git_ignored():
    """A documented command run in the repository (`train ... --out runs/qs`, `prepare-text ...
    --out shards/tiny`, `plot runs/dp runs/quickstart-*` into ./plots) leaves `git status` clean:
    each relative folder's top is ignored."""
    ignored = {
        line.strip().rstrip("/")
        for line in (ROOT / ".gitignore").read_text().splitlines()
        if line.strip().endswith("/")
    }
    tops = set()
    for page in PAGES:
        for block in FENCE.finditer(page.read_text()):
            # Relative paths only: not /shared/..., gs://..., "$RUN", nor a placeholder (DIR).
            for folder in re.findall(r"--out[ =]+([a-z][\w.-]*(?:/[\w.-]+)*)(?=\s|$)", block[0]):
                tops.add(folder.split("/")[0])
            # `dtcli plot` of several runs (or a glob) without --out writes ./plots.
            for line in re.findall(r"^dtcli plot (.*)$", block[0], re.MULTILINE):
                runs = [a for a in line.split("#")[0].split() if not a.startswith(("-", "["))]
                if "--out" not in line and (len(runs) > 1 or "*" in line):
                    tops.add("plots")
    assert {"runs", "shards", "plots"} <= tops  # what the README's examples write today
    assert tops <= ignored, f"not in .gitignore: {sorted(tops - ignored)}"
