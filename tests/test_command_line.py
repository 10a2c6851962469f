"""A new user's first contact with the console scripts: every help renders clean, and the mistakes one types (a NaN,
a negative, a word where a number goes, an unknown option, a missing file) each get one line `<command>: error:
...`, exit status 2, within seconds (before any model loads), and leave an earlier run's outputs as they were."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = dict(re.findall(r'"(acpo-[a-z]+)=([\w.]+):main"', (ROOT / "setup.py").read_text()))
DEBRIS = ("{'option_strings'", "object at 0x", "%(", "<argparse.", "<class '")


def test_every_console_script_help_renders_clean(capsys):
    """Every console script's --help and each of its subcommands' (an unescaped % in a help string printed argparse's
    internals into acpo-train's help)."""
    import importlib

    assert set(SCRIPTS) == {"acpo-train", "acpo-warmup", "acpo-eval", "acpo-dlogp", "acpo-study", "acpo-demo"}

    def render(main, argv) -> str:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        out = capsys.readouterr().out
        assert exit_info.value.code == 0 and out.startswith("usage:"), (argv, out[:200])
        return out

    for name, module in SCRIPTS.items():
        main = importlib.import_module(module).main
        text = render(main, ["--help"])
        usage = text.split("\n\n")[0]
        commands = re.search(r"\{([\w,-]+)\}", usage)
        texts = [text] + [render(main, [sub, "--help"]) for sub in (commands.group(1).split(",") if commands else [])
                          if not sub.startswith("_")]
        for text in texts:
            assert not [d for d in DEBRIS if d in text], (name, [line for line in text.splitlines()
                                                                 if any(d in line for d in DEBRIS)])


def _earlier_run(folder: Path) -> dict[str, bytes]:
    """An earlier run's outputs in ``folder`` (what acpo-train, acpo-eval and acpo-dlogp write there)."""
    files = {"metrics.jsonl": b'{"step": 1, "reward": 0.5}\n', "report.md": b"# acpo-train report: addition\n",
             "training_curves.png": b"\x89PNG\r\n\x1a\n earlier", "samples.jsonl": b'{"benchmark": "math500"}\n',
             "results.json": b"{}\n", "results.md": b"| benchmark |\n"}
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


@pytest.mark.slow
def test_a_new_users_mistakes_get_one_line_within_seconds_and_lose_nothing(tmp_path, tiny_dir):
    out = tmp_path / "out"
    earlier = _earlier_run(out)
    missing = str(tmp_path / "missing.yaml")
    train = ["acpo-train", "--config", "configs/demo.yaml", "--output_dir", str(out)]
    evaluate = ["acpo-eval", "--model_name_or_path", tiny_dir, "--output_dir", str(out)]
    generate = ["acpo-dlogp", "generate", "--base", "offline", "--rl", "offline", "--out_dir", str(out),
                "--benchmark", "math500"]
    study = ["acpo-study", "run", "--out", str(out), "--no-report"]
    demo = ["acpo-demo", "--output-dir", str(out)]
    cases = [  # (command, what the one line must say)
        (train + ["--learning_rate", "nan"], "ACPOConfig.learning_rate=nan: must be a finite number >= 0"),
        (train + ["--beta", "-0.1"], "ACPOConfig.beta=-0.1: must be a finite number >= 0"),
        (train + ["--max_grad_norm", "one"], "argument --max_grad_norm/--max-grad-norm: invalid float value: 'one'"),
        (train + ["--learning_rte", "1e-5"], "unknown field learning_rte (did you mean learning_rate?)"),
        (["acpo-train", "--config", missing], f"--config {missing!r}: no such file"),
        (evaluate + ["--temperature", "nan"], "EvalConfig.temperature=nan: must be a finite number >= 0"),
        (evaluate + ["--limit", "-1"], "EvalConfig.limit=-1: must be an integer >= 1"),
        (evaluate + ["--k", "many"], "argument --k: invalid int value: 'many'"),
        (evaluate + ["--temprature", "1"], "unknown field temprature (did you mean temperature?)"),
        (evaluate + ["--benchmarks", f"math500={tmp_path / 'none.jsonl'}"], "no file at"),
        (generate + ["--tau", "nan"], "DecodeConfig.tau=nan: must be a finite number"),
        (generate + ["--limit", "-1"], "argument --limit: '-1' is not an integer >= 1"),
        (generate + ["--temperature", "hot"], "argument --temperature: invalid float value: 'hot'"),
        (generate + ["--gama", "0.1"], "unrecognized arguments: --gama 0.1"),
        (["acpo-dlogp", "score", "--base", "offline", "--rl", "offline", "--out_dir", str(out), "--responses",
          f"rl={tmp_path / 'none'}"], "No acpo-eval samples at"),
        (study + ["--alphas", "nan"], "argument --alphas: 'nan' is not a finite number >= 0"),
        (study + ["--seeds", "-2"], "argument --seeds: '-2' is not an integer >= 1"),
        (["acpo-study", "drift", "--lrs", "fast", "--out", str(out)], "argument --lrs: 'fast' is not a number"),
        (study + ["--frobnicate"], "unrecognized arguments: --frobnicate"),
        (study + ["--recipe", missing], f"--recipe {missing}: no such file"),
        (["acpo-warmup", "--recipe", missing], f"--config {missing!r}: no such file"),
        (["acpo-warmup", "--recipe", "configs/demo.yaml", "--learning_rate", "nan"],
         "WarmupArguments.learning_rate=nan: must be a finite number > 0"),
        (demo + ["--steps", "nan"], "argument --steps: 'nan' is not an integer"),
        (demo + ["--seed", "-1"], "argument --seed: '-1' is not an integer >= 0"),
        (demo + ["--updates-per-rollout", "four"], "argument --updates-per-rollout: 'four' is not an integer"),
        (demo + ["--lr", "0.1"], "unrecognized arguments: --lr 0.1"),
    ]
    assert {command[0] for command, _ in cases} == set(SCRIPTS)
    # The offline model is built on first use into this (empty) folder: if a run got that far, it would not be empty.
    env = {**os.environ, "ACPO_OFFLINE_MODEL_DIR": str(tmp_path / "model_cache"), "PYTHONPATH": str(ROOT)}

    def run(command):
        start = time.time()
        result = subprocess.run([str(Path(sys.executable).with_name(command[0])), *command[1:]], capture_output=True,
                                text=True, cwd=ROOT, env=env, timeout=120)
        return result, time.time() - start

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, [command for command, _ in cases]))
    for (command, expected), (result, seconds) in zip(cases, results):
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, (command, result.returncode, result.stderr[-2000:])
        assert lines[0].startswith(f"{command[0]}: error: ") and expected in lines[0], (command, lines[0])
        assert seconds < 60, (command, seconds)  # the import, not the model: the reporter's NaN took 78 s
    assert not (tmp_path / "model_cache").exists()
    assert {name: (out / name).read_bytes() for name in earlier} == earlier
    assert sorted(p.name for p in out.iterdir()) == sorted(earlier)
