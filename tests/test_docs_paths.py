"""Every repository path that README.md and docs/*.md name is there: a markdown link to a file or folder, and a
backticked path from the repository root (`study/running_sum/table.md`) or a module of the package
(`losses/dcpo.py`), in the tree or, for a run of a packed grid (`study/smollm2/runs/<run id>/`), in that grid's pack
(acpo_trl/study/pack.py). A path git ignores is what a run writes, not the repository's; `<name>` in a path is a
placeholder."""

from __future__ import annotations

import fnmatch
import functools
import glob
import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

from acpo_trl.study.pack import PACK, read_pack

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)
CODE = re.compile(r"`([^`\s]+/[^`\s]*)`")  # `a/path`, no spaces (a command line is not a path)


def named_paths(doc: Path, tops: set[str]) -> list[tuple[str, list[str]]]:
    """(what the doc wrote, the repository paths it may mean) for each path ``doc`` names."""
    found = []
    for target in LINK.findall(doc.read_text()):
        target = target.split("#")[0]
        if target and not re.match(r"[a-z]+:", target):  # not an anchor, not a URL
            found.append((target, [Path(os.path.relpath(doc.parent / unquote(target), ROOT)).as_posix()]))
    package = {p.name for p in (ROOT / "acpo_trl").iterdir() if p.is_dir()}
    for code in CODE.findall(doc.read_text()):
        path = re.split(r"::|:\d", code.removeprefix("./"))[0]  # file.py::function, file.py:12
        first = path.split("/")[0]
        meant = [path] if first in tops else []
        if first in package and path.endswith(".py"):  # a module of the package (`data/x.jsonl` is a user's file)
            meant.append(f"acpo_trl/{path}")
        if meant:
            found.append((code, meant))
    return found


@functools.lru_cache(maxsize=None)
def packed_names(grid: str) -> tuple[str, ...]:
    """What a grid's pack holds, as paths under its ``runs/``: every run's folder, their parents and their files."""
    names = set()
    for run_id, record in read_pack(ROOT / grid).items():
        parts = run_id.split("/")
        names.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
        names.update(f"{run_id}/{name}" for name in record if name != "run")
    return tuple(sorted(names))


def is_there(path: str) -> bool:
    pattern = re.sub(r"<[^>]*>", "*", path).rstrip("/")
    if glob.has_magic(pattern) and list(ROOT.glob(pattern)) or (ROOT / pattern).exists():
        return True
    runs = re.fullmatch(r"(?:(.+)/)?runs(?:/(.*))?", pattern)  # a run of a packed grid
    if runs and (ROOT / (runs[1] or "") / PACK).is_file():
        names = packed_names(runs[1] or "")
        return bool(names) if not runs[2] else any(fnmatch.fnmatchcase(name, runs[2]) for name in names)
    return False


def is_ignored(path: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0


def test_every_path_the_docs_name_is_in_the_repository():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout (which paths it tracks and ignores)")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    tops = {line.split("/")[0] for line in tracked.splitlines()}
    missing = [f"{doc.relative_to(ROOT)}: {written}" for doc in DOCS for written, paths in named_paths(doc, tops)
               if not any(is_there(path) or is_ignored(path) for path in paths)]
    assert not missing, "paths the docs name that are not in the repository:\n" + "\n".join(missing)
