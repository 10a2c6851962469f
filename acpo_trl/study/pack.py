"""A finished grid packed: ``<out>/runs.jsonl.gz`` holds the runs that were folders under ``<out>/runs/``, so that
the repository commits one file per grid, not a folder per run (``acpo-study pack --out DIR``).

The pack is gzipped JSON Lines, one record per run, sorted by run id::

    {"run": "<run_id>", "result.json": {...}, "spec.json": {...}, "eval_before_after.json": {...},
     "log.txt": "...", "report.md": "..."}

``run_id`` is the run's former folder under ``runs/``; each file of :data:`PACKED` that the folder had is kept,
a JSON file as its object (``result.json`` unchanged), a text file as its text. These are the files git keeps of
a run; what it ignores (``metrics.jsonl``, the per-run plots) stays in the folder, which goes once empty. Packing
again merges: a run folder replaces the packed run of its id, as it wins in :func:`results.finished_runs`. Gzip
without a timestamp and sorted records: packing the same runs twice gives the same bytes.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
from pathlib import Path

from ..utils.cli_errors import UserError

PACK = "runs.jsonl.gz"
PACKED = ("result.json", "spec.json", "eval_before_after.json", "log.txt", "report.md")


def run_order(run_id: str) -> list[str]:
    """Sort key of run ids: the order of their folders' paths (part by part: ``acpo/`` before ``acpo-alpha1/``),
    in which the report has always read the runs."""
    return run_id.split("/")


def read_pack(out_dir: str | Path) -> dict[str, dict]:
    """The records of ``out_dir``'s pack by run id ({} when it has none)."""
    path = Path(out_dir) / PACK
    if not path.is_file():
        return {}
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return {record["run"]: record for record in map(json.loads, lines)}


def packed_ids(out_dir: str | Path) -> frozenset[str]:
    """The run ids in ``out_dir``'s pack, read again only when the file changes (a grid asks for every cell)."""
    path = Path(out_dir) / PACK
    try:
        stat = path.stat()
    except FileNotFoundError:
        return frozenset()
    return _ids(str(path.resolve()), stat.st_mtime_ns, stat.st_size, stat.st_ino)


@functools.lru_cache(maxsize=16)
def _ids(path: str, mtime_ns: int, size: int, inode: int) -> frozenset[str]:
    return frozenset(read_pack(Path(path).parent))


def pack(out_dir: str | Path) -> tuple[int, int]:
    """Pack ``out_dir``'s finished run folders (those with ``result.json``) into its pack, then delete the packed
    files and the folders left empty. Returns (runs packed now, runs in the pack)."""
    out_dir = Path(out_dir)
    runs = out_dir / "runs"
    folders = [path.parent for path in sorted(runs.glob("**/result.json"))]
    records = read_pack(out_dir)
    for folder in folders:
        run_id = folder.relative_to(runs).as_posix()
        records[run_id] = {"run": run_id, **{name: _read(folder / name) for name in PACKED
                                              if (folder / name).is_file()}}
    if folders:
        _write(out_dir / PACK, records)
    for folder in folders:
        for path in [*(folder / name for name in PACKED), *folder.glob(".claim-*")]:
            path.unlink(missing_ok=True)
        while folder != out_dir and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent
    return len(folders), len(records)


def run_file(out_dir: str | Path, run_id: str, name: str = "result.json") -> str:
    """The text of one file of a run, from its folder or from the pack (a JSON file as ``json.dumps(indent=1)``)."""
    path = Path(out_dir) / "runs" / run_id / name
    if path.is_file():
        return path.read_text()
    record = read_pack(out_dir).get(run_id)
    if record is None:
        raise UserError(f"{out_dir}: no run {run_id}", f"give a run id of {Path(out_dir) / PACK} (its records' "
                        f"\"run\") or of a folder under {Path(out_dir) / 'runs'}")
    if name not in record:
        raise UserError(f"{run_id}: no {name} in the pack", f"choose from {', '.join(k for k in record if k != 'run')}")
    content = record[name]
    return content if isinstance(content, str) else json.dumps(content, indent=1)


def _read(path: Path):
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else text


def _write(path: Path, records: dict[str, dict]) -> None:
    """Write the pack atomically (a reader sees the old or the new one), the same records always to the same bytes."""
    lines = [json.dumps(records[run], ensure_ascii=False, separators=(",", ":")) + "\n"
             for run in sorted(records, key=run_order)]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(gzip.compress("".join(lines).encode(), compresslevel=9, mtime=0))
    os.replace(tmp, path)
