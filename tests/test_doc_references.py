"""Every reference from one repository file to another resolves, and nothing cites material
outside the repository.

Scanned: every file git tracks plus the untracked files it does not ignore (a new doc is
checked before it is committed). A reference is a relative path under one of the source
folders (`docs/privacy.md`, `src/dpmed/io.py`, `workflow/report/<name>.rst`) or a top-level
file, optionally with a `#anchor`; a Markdown link target relative to the linking file; or a
cited finding (`docs/privacy.md, finding 7`, `findings 1-4`, `findings 8 and 9`). The path must
be a repository file, the anchor a heading of it (GitHub's slugs), the finding a numbered bold
item of it (`7. **Title.**`). Output paths such as `results/tables/...` are generated, never
tracked, and are not references.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO

SOURCE_FOLDERS = (
    "bench",
    "config",
    "docs",
    "envs",
    "profiles",
    "rules",
    "src",
    "tests",
    "workflow",
)
# Folders holding files laid out as in a repository (tests/test_toy_study.py copies them in).
TEMPLATES = ("tests/toy_study/",)
TOP_FILES = ("LICENSE", "Makefile", "README.md", "Snakefile", "pyproject.toml")
EXTENSIONS = ("cfg", "csv", "ini", "json", "md", "py", "rst", "sh", "smk", "toml", "txt", "yaml")
_END = r"(?![\w/-]|\.\w)(?:#(?P<anchor>[\w-]+))?"
PATH_REF = re.compile(
    r"(?<![\w./-])(?P<path>(?:"
    + "|".join(SOURCE_FOLDERS)
    + r")/[\w./-]*?\.(?:"
    + "|".join(EXTENSIONS)
    + r")|"
    + "|".join(re.escape(name) for name in TOP_FILES)
    + r")"
    + _END
)
MARKDOWN_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
FINDING_REF = re.compile(
    r"(?<![\w./-])(?P<path>(?:[\w-]+/)*[\w-]+\.md),\s+(?:note\s+to\s+)?findings?\s+"
    r"(?P<numbers>\d+(?:\s*(?:[-–,]|and)\s*\d+)*)"
)
FINDING_ITEM = re.compile(r"^(\d+)\. \*\*", flags=re.MULTILINE)
# Material outside the repository (the patterns never match their own source text).
OUTSIDE = re.compile(r"\bREFERENCE\.md|\bDESIGN\.md|\bDESIGN[ ]principle|\bshared[/]papers")


@dataclass(frozen=True)
class Reference:
    """One reference: where it is (`source`, 1-based `line`) and what it names."""

    source: str
    line: int
    path: str
    anchor: str | None = None
    findings: tuple[int, ...] = ()


def repository_files() -> list[str]:
    """Tracked files plus untracked, not-ignored ones, as POSIX paths relative to the repo."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return sorted({name for name in out.decode().split("\0") if (REPO / name).is_file()})


def read_text(path: Path) -> str | None:
    """The file's text, or None for a binary file."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped (letters, digits,
    `_`, `-` and spaces kept), spaces to `-`; inline code marks and link syntax dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " _-")
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading anchor of a Markdown text; repeated slugs get -1, -2, ... as on GitHub.
    Lines inside fenced code blocks are not headings."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def findings(markdown: str) -> set[int]:
    """The numbers of the numbered findings (`N. **Title.**` at the start of a line)."""
    return {int(n) for n in FINDING_ITEM.findall(markdown)}


def _numbers(text: str) -> tuple[int, ...]:
    """`1-4` → 1, 2, 3, 4; `8 and 9` → 8, 9; `1, 3` → 1, 3."""
    out: list[int] = []
    for part in re.split(r"\s*(?:,|and)\s*", text.strip()):
        ends = [int(n) for n in re.split(r"\s*[-–]\s*", part)]
        out.extend(range(ends[0], ends[-1] + 1))
    return tuple(out)


def references(source: str, text: str) -> Iterator[Reference]:
    """Every reference in the text of repository file `source`."""

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    for match in PATH_REF.finditer(text):
        yield Reference(source, line_of(match.start()), match["path"], match["anchor"])
    for match in FINDING_REF.finditer(text):
        yield Reference(
            source, line_of(match.start()), match["path"], None, _numbers(match["numbers"])
        )
    if not source.endswith(".md"):
        return
    for match in MARKDOWN_LINK.finditer(text):
        target = match["target"]
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        resolved = (Path(source).parent / path).as_posix() if path else source
        yield Reference(source, line_of(match.start()), _normalise(resolved), anchor or None)


def _normalise(path: str) -> str:
    """Collapse `.` and `..` segments of a relative POSIX path (`..` above the root is kept)."""
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == ".." and parts and parts[-1] != "..":
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def resolved(ref: Reference, texts: dict[str, str | None]) -> str:
    """The repository file `ref` names: a file of a repository template (tests/toy_study/, the
    toy study's files as they sit in a repository) may name the template's own files."""
    template = next((t for t in TEMPLATES if ref.source.startswith(t)), "")
    return template + ref.path if ref.path not in texts else ref.path


def problems(refs: list[Reference], texts: dict[str, str | None]) -> list[str]:
    """What does not resolve, one line per reference. `texts`: repository file → its text."""
    out = []
    for ref in refs:
        where = f"{ref.source}:{ref.line}: {ref.path}"
        path = resolved(ref, texts)
        if path not in texts:
            out.append(f"{where}: no such file in the repository")
            continue
        target = texts[path] or ""
        if ref.anchor is not None:
            if not path.endswith(".md"):
                out.append(f"{where}#{ref.anchor}: anchors are checked only in Markdown files")
            elif ref.anchor not in anchors(target):
                out.append(f"{where}#{ref.anchor}: no such heading")
        missing = sorted(set(ref.findings) - findings(target))
        if missing:
            out.append(f"{where}: no finding {', '.join(map(str, missing))}")
    return out


def scan(files: list[str], root: Path) -> tuple[list[Reference], dict[str, str | None]]:
    """All references of the text files among `files` (relative to `root`), and their texts."""
    texts = {name: read_text(root / name) for name in files}
    refs = [ref for name, text in texts.items() if text for ref in references(name, text)]
    return refs, texts


def test_every_reference_to_a_repository_file_resolves():
    refs, texts = scan(repository_files(), REPO)
    assert len(refs) > 50, "the scan found almost no references: is the pattern broken?"
    assert any(ref.findings for ref in refs), "no finding citation was recognised"
    found = problems(refs, texts)
    assert not found, "\n".join(found)


def test_no_file_names_documents_outside_the_repository():
    offenders = []
    for name in repository_files():
        text = read_text(REPO / name)
        for number, line in enumerate((text or "").splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_check_reports_each_kind_of_dangling_reference(tmp_path):
    """A tiny repository with one good and one bad reference of each kind."""
    doc = "# Title\n\n## The unit: what ε protects\n\n1. **First.** text\n2. **Second.**\n"
    folder = "docs"
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "guide.md").write_text(doc)
    good = (
        f"see {folder}/guide.md#the-unit-what-ε-protects and [x](guide.md#title),"
        f" ({folder}/guide.md, findings 1 and 2) and ({folder}/guide.md, note to finding 1)"
    )
    bad = (
        f"see {folder}/gone.md, {folder}/guide.md#no-such, [y](../{folder}/none.md),"
        f" ({folder}/guide.md, findings 1-3)"
    )
    (tmp_path / folder / "good.md").write_text(good)
    (tmp_path / folder / "bad.md").write_text(bad)
    files = [f"{folder}/{name}" for name in ("guide.md", "good.md", "bad.md")]
    refs, texts = scan(files, tmp_path)
    found = problems(refs, texts)
    assert all(line.startswith(f"{folder}/bad.md:1: ") for line in found), found
    assert [line.split(": ", 2)[2] for line in found] == [
        "no such file in the repository",
        "no such heading",
        "no finding 3",
        "no such file in the repository",
    ]
    assert {ref.path for ref in refs if ref.source.endswith("bad.md")} >= {
        f"{folder}/gone.md",
        f"{folder}/none.md",
    }


def test_outputs_and_placeholders_are_not_references():
    text = "results/tables/x.csv, workflow/report/{name}.rst, tests/test_<study>_*.py, a/docs/x.md"
    assert list(references("README.md", text)) == []


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("The privacy unit of each dataset", "the-privacy-unit-of-each-dataset"),
        ("fets (paper 000, DP-SimAgg)", "fets-paper-000-dp-simagg"),
        ("What a guarantee covers, and where the noise comes from",
         "what-a-guarantee-covers-and-where-the-noise-comes-from"),
        ("HD95: `hd95` in [docs](x.md)", "hd95-hd95-in-docs"),
        ("Duke DME OCT (Chiu et al. 2015)", "duke-dme-oct-chiu-et-al-2015"),
    ],
)  # fmt: skip
def test_slug_is_githubs(heading, anchor):
    assert slug(heading) == anchor


def test_repeated_headings_get_numbered_anchors():
    text = "# A\n## Notes\n```\n# not a heading\n```\n## Notes\n"
    assert anchors(text) == {"a", "notes", "notes-1"}
