"""Resumable on-disk store of an evaluation run's samples.

``<output_dir>/run.json`` holds the settings that determine the samples; ``<output_dir>/samples.jsonl`` gets one
line per (benchmark, problem, seed) record, appended and flushed after every generation batch. A rerun with
the same settings skips the records already there, so an interrupted run loses at most the batch in flight.
A torn last line (the process killed mid-write) is ignored and its batch generated again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

RUN_FILE = "run.json"
SAMPLES_FILE = "samples.jsonl"

Key = tuple[str, int, int]  # (benchmark, problem index, seed)


def record_key(record: Mapping) -> Key:
    return (record["benchmark"], record["index"], record["seed"])


class SampleStore:
    """Append-only sample records of one run in ``output_dir``.

    Args:
        output_dir: the run's folder (created if needed).
        settings: JSON-serialisable settings the samples depend on (model, decoding, prompts, seeds, ...). An
            existing run with other settings is refused, unless ``overwrite`` starts it afresh.
        overwrite: delete the existing samples instead of resuming.
    """

    def __init__(self, output_dir: str | os.PathLike, settings: Mapping, overwrite: bool = False):
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.samples_path = self.dir / SAMPLES_FILE
        settings = json.loads(json.dumps(settings))  # normalise (tuples -> lists) for the comparison
        run_path = self.dir / RUN_FILE
        if overwrite:
            self.samples_path.unlink(missing_ok=True)
        elif run_path.is_file():
            previous = json.loads(run_path.read_text())
            changed = {k: (previous.get(k), v) for k, v in settings.items() if previous.get(k) != v}
            if changed:
                details = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
                raise ValueError(
                    f"{self.dir} holds a run with other settings ({details}). Resume with the same settings, "
                    "choose another `output_dir`, or pass `overwrite=True` (--overwrite) to start afresh."
                )
        run_path.write_text(json.dumps(settings, indent=2) + "\n")
        self.records: dict[Key, dict] = {}
        if self.samples_path.is_file():
            for line in self.samples_path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # torn write of an interrupted batch: that batch is generated again
                self.records[record_key(record)] = record

    def __contains__(self, key: Key) -> bool:
        return key in self.records

    def append(self, records: Iterable[Mapping]) -> None:
        """Write ``records`` (one generation batch) durably, then remember them."""
        records = list(records)
        payload = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in records)
        with open(self.samples_path, "a+", encoding="utf-8") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:  # a torn last line from a killed run would swallow our first record: end it
                f.seek(f.tell() - 1)
                if f.read(1) != "\n":
                    payload = "\n" + payload
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        for record in records:
            self.records[record_key(record)] = dict(record)
