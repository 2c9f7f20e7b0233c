"""Every file the documentation names in this repository exists, and bench/results keeps one
current result per claim (issue 70).

Checked in README.md and every page under docs/: each relative Markdown link (resolved from the
page's folder; the anchor is MkDocs' to check), and each path under bench/ that a page names
(the harnesses and the result files: pages name files outside docs/ as code spans, since the site
is served without the repository). A path may be a glob (`*`) or name alternatives (`{1,4}`): at
least one file must match. bench/results/README.md's file names are checked the same way,
relative to that folder. And the other way round: every file under bench/results is named by a
page or by bench/results/README.md (directly, by a glob or alternatives, or by a folder above
it; a host.txt or hosts.txt goes with the results beside or below it), so nothing uncited
accumulates there. In a git checkout the pages and the files are git's
tracked ones (what a fresh clone, CI's, has); elsewhere, what is on disk."""

from __future__ import annotations

import fnmatch
import posixpath
import re
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = "bench/results"
# bench/results holds the files the pages cite, with their hosts: superseded measurements leave
# the tree (git keeps them), so the folder stays small enough to read.
RESULTS_LIMIT = 150

# [text](target) and ![alt](target), an optional "title" after the target
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# bench/… anywhere in a page (code spans included), not inside a longer path or name, nor at a
# commit (`git show REV:bench/results/…` names a file that left the tree)
BENCH_PATH = re.compile(r"(?<![\w/.:-])((?:\.\./)*bench/[\w.*?{},/-]*)")
# a results file named in bench/results/README.md: a code span holding a dated name
RESULT_NAME = re.compile(r"`([\w.*?{},/-]*20\d\d-\d\d-\d\d[\w.*?{},/-]*)`")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# the hardware a result came from, kept beside it (or at the top of its folder)
HOST_FILES = ("host.txt", "hosts.txt")


@dataclass(frozen=True)
class Tree:
    """The repository's files (posix paths from its root) and every folder above them."""

    files: frozenset[str]
    dirs: frozenset[str]

    @classmethod
    def of(cls, files: Iterable[str]) -> Tree:
        files = frozenset(files)
        dirs = {posixpath.dirname(f) for f in files}
        for d in list(dirs):
            while d:
                dirs.add(d)
                d = posixpath.dirname(d)
        return cls(files, frozenset(dirs))

    def has(self, path: str) -> bool:
        """Whether `path` (a glob, with {a,b} alternatives, allowed) names a file or folder."""
        for pattern in _alternatives(path.rstrip("/") or "."):
            if any(c in pattern for c in "*?["):
                if any(fnmatch.fnmatchcase(f, pattern) for f in self.files):
                    return True
            elif pattern in self.files or pattern in self.dirs or pattern == ".":
                return True
        return False


def _alternatives(path: str) -> list[str]:
    """`a{1,4}b` → a1b, a4b (one level of braces, as the pages write them)."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    head, tail = path[: match.start()], path[match.end() :]
    return [p for alt in match.group(1).split(",") for p in _alternatives(head + alt + tail)]


def _git_files() -> list[str] | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    top = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"], capture_output=True, text=True
    )
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != ROOT:
        return None
    return [f for f in done.stdout.decode().split("\0") if f]


def _disk_files() -> list[str]:
    skip = {".git", ".venv", "node_modules", "__pycache__", "site"}
    return [
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("*")
        if p.is_file() and not skip.intersection(p.relative_to(ROOT).parts)
    ]


GIT_FILES = _git_files()
TREE = Tree.of(GIT_FILES if GIT_FILES is not None else _disk_files())


def pages(tree: Tree) -> list[str]:
    return sorted(
        f for f in tree.files if f == "README.md" or (f.startswith("docs/") and f.endswith(".md"))
    )


def _outside(path: str) -> bool:
    return path == ".." or path.startswith("../")


def named(page: str, text: str) -> Iterator[tuple[int, str, str]]:
    """The bench/ paths `text` (the page `page`) names: line number, the path as written and
    the path from the repository's root; in bench/results/README.md its bare results names
    too."""
    folder = posixpath.dirname(page)
    for number, line in enumerate(text.splitlines(), 1):
        for path in BENCH_PATH.findall(line):
            path = path.rstrip(".,;:")
            base = folder if path.startswith("../") else ""
            yield number, path, posixpath.normpath(posixpath.join(base, path))
        if page == f"{RESULTS}/README.md":
            for name in RESULT_NAME.findall(line):
                yield number, f"{name} (in {RESULTS}/)", f"{RESULTS}/{name}"


def missing(page: str, text: str, tree: Tree) -> Iterator[str]:
    """What `text` (the page `page`, a path from the repository's root) names that `tree` lacks:
    one line each, with the line number."""
    folder = posixpath.dirname(page)
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        for target in LINK.findall(line):
            if target.startswith("#") or SCHEME.match(target):
                continue
            path = target.split("#", 1)[0].split("?", 1)[0]
            resolved = posixpath.normpath(posixpath.join(folder, path))
            if target.startswith("/") or _outside(resolved) or not tree.has(resolved):
                problems.append((number, f"link to {target}"))
    for number, shown, resolved in named(page, text):
        if _outside(resolved) or not tree.has(resolved):
            problems.append((number, shown))
    for number, problem in sorted(problems, key=lambda p: p[0]):
        yield f"{page}:{number}: {problem}"


def covers(pattern: str, path: str) -> bool:
    """Whether `pattern` (a path, a glob or alternatives, as the pages name files) names the
    file `path` or a folder above it."""
    return any(
        fnmatch.fnmatchcase(path, alternative) or path.startswith(alternative + "/")
        for alternative in _alternatives(pattern.rstrip("/"))
    )


def uncited(pages_text: dict[str, str], tree: Tree) -> list[str]:
    """The files under bench/results that no page of `pages_text` (page → its text) names."""
    patterns = {
        path
        for page, text in pages_text.items()
        for *_, path in named(page, text)
        if path.startswith(f"{RESULTS}/")  # bench/ or bench/results as a whole cites nothing
    }
    results = [f for f in tree.files if f.startswith(f"{RESULTS}/") and f != f"{RESULTS}/README.md"]
    cited = {f for f in results if any(covers(p, f) for p in patterns)}
    # a host.txt / hosts.txt goes with the results beside it or below it (bench/results/README.md)
    hosts = {
        f
        for f in results
        if posixpath.basename(f) in HOST_FILES
        and any(c.startswith(posixpath.dirname(f) + "/") for c in cited - {f})
    }
    return sorted(set(results) - cited - hosts)


def _checked_pages() -> dict[str, str]:
    return {
        page: (ROOT / page).read_text(encoding="utf-8")
        for page in [*pages(TREE), f"{RESULTS}/README.md"]
        if (ROOT / page).is_file()
    }


def test_every_file_the_documentation_names_exists() -> None:
    checked = [*pages(TREE), f"{RESULTS}/README.md"]
    assert "docs/benchmarks.md" in checked
    problems = [
        problem
        for page in checked
        if (ROOT / page).is_file()
        for problem in missing(page, (ROOT / page).read_text(encoding="utf-8"), TREE)
    ]
    assert not problems, "named but not in the repository:\n" + "\n".join(problems)


def test_every_results_file_is_cited() -> None:
    if GIT_FILES is None:
        pytest.skip("not a git checkout: which files are tracked is unknown")
    left = uncited(_checked_pages(), TREE)
    assert not left, (
        "in bench/results but named by no page nor bench/results/README.md: cite each where its "
        "claim is made, or git rm it (git history keeps it):\n" + "\n".join(left)
    )


def test_bench_results_keeps_few_files() -> None:
    if GIT_FILES is None:
        pytest.skip("not a git checkout: which files are tracked is unknown")
    tracked = [f for f in GIT_FILES if f.startswith(f"{RESULTS}/")]
    assert len(tracked) < RESULTS_LIMIT, (
        f"{RESULTS} holds {len(tracked)} tracked files (limit {RESULTS_LIMIT}): keep the files "
        "the pages cite, with their hosts, and git rm what a newer result replaced"
    )


def test_a_missing_file_is_found() -> None:
    """The check itself: each way of naming a file, present and absent."""
    tree = Tree.of(
        [
            "README.md",
            "docs/a.md",
            "docs/sub/b.md",
            "bench/run.py",
            "bench/results/README.md",
            "bench/results/2026-01-01_x_cpu2.json",
            "bench/results/2026-01-02_s1/call1/run_1gpu.json",
        ]
    )
    page = """See [a](a.md#top), [b](sub/b.md), [out](https://example.org/x), [here](#anchor),
`bench/run.py --out x.json`, `bench/results/2026-01-01_x_cpu2.json`, `bench/results/`,
`bench/results/2026-01-02_s1/call*/run_{1,4}gpu.json`, `bench/results/2026-01-02_s1/`.
"""
    assert list(missing("docs/a.md", page, tree)) == []
    planted = """[gone](gone.md) and [up](../README.md) and [out of the tree](../../x.md)
`bench/results/2026-01-01_y_cpu2.json`, `bench/results/2026-01-03_s2/`, `bench/gone.py`,
`bench/results/2026-01-02_s1/call*/run_8gpu.json`
"""
    found = list(missing("docs/a.md", planted, tree))
    assert found == [
        "docs/a.md:1: link to gone.md",
        "docs/a.md:1: link to ../../x.md",
        "docs/a.md:2: bench/results/2026-01-01_y_cpu2.json",
        "docs/a.md:2: bench/results/2026-01-03_s2/",
        "docs/a.md:2: bench/gone.py",
        "docs/a.md:3: bench/results/2026-01-02_s1/call*/run_8gpu.json",
    ]
    index = (
        "`2026-01-01_x_cpu2.json`, `2026-01-09_z.json`,"
        " `git show aad2d9d:bench/results/2025-12-31_gone.json`"
    )
    assert list(missing("bench/results/README.md", index, tree)) == [
        "bench/results/README.md:1: 2026-01-09_z.json (in bench/results/)"
    ]


def test_an_uncited_result_is_found() -> None:
    """The check the other way round: a results file no page names, named directly, by a glob,
    by alternatives or by its folder, and a host file beside a cited result or an uncited one."""
    tree = Tree.of(
        [
            "bench/results/README.md",
            "bench/results/2026-01-01_x_cpu2.json",
            "bench/results/2026-01-02_s1/call1/run_1gpu.json",
            "bench/results/2026-01-02_s1/call1/run_4gpu.json",
            "bench/results/2026-01-02_s1/hosts.txt",
            "bench/results/2026-01-03_s2/a.log",
            "bench/results/2026-01-04_y_cpu2.json",
            "bench/results/2026-01-05_s3/host.txt",
            "bench/results/2026-01-05_s3/old.json",
            "bench/results/2026-01-06_z_cpu2.json",
        ]
    )
    texts = {
        "docs/a.md": "`bench/results/2026-01-02_s1/call*/run_{1,4}gpu.json`, `bench/results/`\n"
        "`bench/results/2026-01-03_s2/` and `bench/`",
        "bench/results/README.md": "`2026-01-01_x_cpu2.json`",
    }
    assert uncited(texts, tree) == [
        "bench/results/2026-01-04_y_cpu2.json",
        "bench/results/2026-01-05_s3/host.txt",
        "bench/results/2026-01-05_s3/old.json",
        "bench/results/2026-01-06_z_cpu2.json",
    ]
