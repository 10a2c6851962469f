"""A finished grid packed into one file (acpo_trl/study/pack.py): the report rebuilds a committed table from it byte
for byte, packing is deterministic and merges, and a resumed grid skips the packed runs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from acpo_trl.study.pack import PACK

ROOT = Path(__file__).resolve().parents[1]


def _finish(out: Path, run_id: str, result: dict) -> None:
    """A run folder as a finished run leaves it: its spec, then its result."""
    folder = out / "runs" / run_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.json").write_text(json.dumps(result["spec"], indent=1))
    (folder / "result.json").write_text(json.dumps(result, indent=1))


def test_a_packed_grid_rebuilds_its_committed_tables_byte_for_byte(tmp_path, capsys):
    """study/running_sum's runs put back in folders and packed in two passes give the committed pack again, bit
    for bit, and from it `acpo-study report` writes the committed table.md and drift_map.md."""
    from acpo_trl.study.cli import main

    grid = ROOT / "study" / "running_sum"
    with gzip.open(grid / PACK, "rt") as lines:
        records = [json.loads(line) for line in lines]
    for half in (records[::2], records[1::2]):  # the second pass merges with the first's pack
        for record in half:
            folder = tmp_path / "runs" / record["run"]
            folder.mkdir(parents=True)
            for name, content in record.items():
                if name != "run":
                    (folder / name).write_text(content if isinstance(content, str) else json.dumps(content, indent=1))
        (folder / "metrics.jsonl").write_text("{}\n")  # what the pack leaves stays in its folder
        assert main(["pack", "--out", str(tmp_path)]) == 0
    assert (tmp_path / PACK).read_bytes() == (grid / PACK).read_bytes()
    assert [p.name for p in (tmp_path / "runs").rglob("*") if p.is_file()] == ["metrics.jsonl"] * 2
    assert main(["pack", "--out", str(tmp_path)]) == 0  # nothing left to pack: the same pack
    assert (tmp_path / PACK).read_bytes() == (grid / PACK).read_bytes()

    assert main(["report", "--out", str(tmp_path), "--plots", "none"]) == 0
    for name in ("table.md", "drift_map.md"):
        assert (tmp_path / name).read_text() == (grid / name).read_text(), name
    capsys.readouterr()
    assert main(["show", "--out", str(tmp_path), records[0]["run"]]) == 0
    assert json.loads(capsys.readouterr().out) == records[0]["result.json"]


def test_a_resumed_grid_skips_packed_runs_and_a_folder_wins_over_the_pack(tmp_path):
    """is_done, load_results and the grid runner see a packed run as finished; a run folder finished again beside
    the pack is the one read (and packed again, replaces it)."""
    from acpo_trl.study.grids import quick_grid
    from acpo_trl.study.pack import pack, run_order
    from acpo_trl.study.results import finished_runs, is_done, load_results
    from acpo_trl.study.runner import next_spec, open_blocks, run_grid

    specs = quick_grid()
    for spec in specs[:3]:
        _finish(tmp_path, spec.run_id, {"spec": spec.to_json(), "warmup_digest": "b" * 12})
    assert pack(tmp_path) == (3, 3)
    assert not (tmp_path / "runs").exists()
    assert [is_done(s, tmp_path) for s in specs] == [True] * 3 + [False] * (len(specs) - 3)
    for spec in specs[3:]:
        _finish(tmp_path, spec.run_id, {"spec": spec.to_json(), "warmup_digest": "a" * 12})
    assert all(is_done(s, tmp_path) for s in specs)
    log = []
    assert run_grid(specs, tmp_path, tmp_path / "warmups", jobs=0, log=log.append) == []
    assert log == [f"{len(specs)} runs, {len(specs)} already finished, 0 to run, 1 at a time"]
    assert next_spec(specs, tmp_path, "s", budget_gib=1.0) is None
    assert load_results(tmp_path) == list(finished_runs(tmp_path).values())
    assert list(finished_runs(tmp_path)) == sorted((s.run_id for s in specs), key=run_order)
    assert open_blocks(specs, tmp_path, "a" * 12) == ([], [("add1", 0)])  # the packed runs' warm-up is another

    again = specs[0]  # a packed run finished again into its folder: read, then packed in place of the packed one
    _finish(tmp_path, again.run_id, {"spec": again.to_json(), "rerun": True})
    assert finished_runs(tmp_path)[again.run_id] == {"spec": again.to_json(), "rerun": True}
    assert pack(tmp_path) == (len(specs) - 2, len(specs))
    assert finished_runs(tmp_path)[again.run_id]["rerun"] and not (tmp_path / "runs").exists()


def test_no_committed_study_file_holds_an_absolute_path():
    """A run writes its folder into its log and result as given; a grid run with an absolute --out must have it made
    relative before it is committed (the repository's results read the same on every machine)."""
    import re
    import subprocess

    absolute = re.compile(r"(?<![\w.])/(?:work|root|home|tmp|Users|mnt|scratch)/")
    try:  # the committed files (a grid running here writes its folders beside them)
        listed = subprocess.run(["git", "ls-files", "study"], cwd=ROOT, capture_output=True, text=True, check=True)
        paths = [ROOT / line for line in listed.stdout.splitlines()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file under study/
        paths = sorted((ROOT / "study").rglob("*"))
    found = []
    for path in paths:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as lines:
                text = lines.read()
        elif path.suffix in (".json", ".md", ".txt", ".csv"):
            text = path.read_text(encoding="utf-8")
        else:
            continue
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in absolute.finditer(text)][:1]
    assert not found, f"absolute paths in committed study files: {found}"
