"""acpo-train end to end on the tiny local model: outputs of the report, LoRA, exact resume, model card, Hub."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch

from conftest import trainer_kwargs, write_toy_recipe




def train(path, *extra, callbacks=None):
    from acpo_trl.recipe import make_parser
    from acpo_trl.run import run

    return run(*make_parser().parse_args_and_config(args=["--config", path, *extra]), callbacks=callbacks)


@pytest.mark.slow
def test_acpo_train_writes_report_plot_and_metrics(tmp_path, tiny_dir):
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 7, "reward": 0.5}\n')  # an earlier run's: replaced, not appended to
    trainer = train(write_toy_recipe(tmp_path, tiny_dir, report=True))
    entries = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in entries if "policy_loss" in e] == [1, 2, 3, 4] and entries[0]["step"] == 1
    assert any(e.get("acpo/bin0/eps") is not None for e in entries)
    assert (out / "training_curves.png").stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert "| eval/toy/avg@2 |" in report and "2 optimizer updates per rollout" in report
    before_after = json.loads((out / "eval_before_after.json").read_text())
    assert set(before_after) == {"before", "after"} and "eval/toy/avg@2" in before_after["after"]
    assert (out / "model.safetensors").exists()
    assert trainer.task_name == "toy"


@pytest.mark.slow
def test_a_run_that_fails_before_training_leaves_an_earlier_run_as_it_was(tmp_path, tiny_dir, monkeypatch):
    """The model loaded and the held-out set evaluated, the run fails as training starts (here building the
    optimizer, where a NaN learning rate used to fail): the earlier run's outputs stay byte for byte."""
    from acpo_trl.trainer import ACPOTrainer

    out = tmp_path / "out"
    out.mkdir()
    earlier = {"metrics.jsonl": b'{"step": 1, "reward": 0.5}\n', "report.md": b"# acpo-train report: toy\n",
               "training_curves.png": b"\x89PNG\r\n\x1a\n earlier", "eval_before_after.json": b"{}\n"}
    for name, data in earlier.items():
        (out / name).write_bytes(data)

    def no_optimizer(self, *args, **kwargs):
        raise RuntimeError("no optimizer")

    monkeypatch.setattr(ACPOTrainer, "create_optimizer", no_optimizer)
    with pytest.raises(RuntimeError, match="no optimizer"):
        train(write_toy_recipe(tmp_path, tiny_dir, report=True))
    assert {name: (out / name).read_bytes() for name in earlier} == earlier


def _eps_entries(upr, rollouts, eps, reward_every_rollout=True):
    """metrics.jsonl-like entries: ``eps(r, k, b)`` at update k of rollout r, one entry per optimizer step (1-based),
    the reward logged at each rollout's first step, and the trainer's closing summary entry."""
    entries = []
    for step in range(1, upr * rollouts + 1):
        r, k = divmod(step - 1, upr)
        entry = {"step": step, "loss": 0.1, **{f"acpo/bin{b}/eps": eps(r, k, b) for b in range(3)}}
        if k == 0 and reward_every_rollout:
            entry["reward"] = 0.1 * r
        entries.append(entry)
    return entries + [{"step": upr * rollouts, "train_runtime": 1.0}]


def test_clip_ranges_by_update_index_within_the_rollout():
    """k = (step - 1) % U from the caller's U, else from the diagnostics' k or the rollout starts (reward steps);
    eps_b is grouped by k over rollouts, not by step."""
    from acpo_trl.diagnostics.plots import eps_by_update, mean_eps_by_update, update_indices

    entries = _eps_entries(4, 3, lambda r, k, b: 0.2 + 0.1 * k * (b + 1) + 0.01 * r)
    assert update_indices(entries, 4.0) == [0, 1, 2, 3] * 3 + [3]
    assert update_indices(entries) == [0, 1, 2, 3] * 3 + [3]  # from the steps that log a reward
    assert update_indices([{"step": 1, "diag/k2/bin0/acpo_eps": 0.3}]) == [2]
    cells, source = eps_by_update(entries, 4)
    assert source == "acpo" and cells[2][3] == pytest.approx([1.1, 1.11, 1.12])
    means = mean_eps_by_update(cells)
    assert sorted(means) == [0, 1, 2] and sorted(means[0]) == [0, 1, 2, 3]
    assert (means[0][0], means[1][2], means[2][3]) == pytest.approx((0.21, 0.61, 1.11))
    assert mean_eps_by_update(eps_by_update(entries)[0]) == means
    # a run with no bin method but diagnostics: ACPO's rule per logged k
    diag = [{"step": s, f"diag/k{(s - 1) % 2}/bin0/acpo_eps": 0.2 + 0.4 * ((s - 1) % 2)} for s in range(1, 5)]
    cells, source = eps_by_update(diag)
    assert source == "diag" and mean_eps_by_update(cells) == {0: {0: pytest.approx(0.2), 1: pytest.approx(0.6)}}
    assert eps_by_update([{"step": 1, "reward": 0.5}]) == ({}, "")


def test_training_curves_draw_the_eps_one_line_and_say_on_policy(tmp_path, monkeypatch):
    """The clip-range panel: one line per bin over k, the dashed line eps = 1 in view once eps comes near it, the
    bins whose mean passes 1 named in the title; on-policy (U = 1) said in the title with no curve."""
    import acpo_trl.diagnostics.plots as plots

    panels = {}
    original = plots.save_figure

    def capture(plt, fig, out_png, title="", dpi=100):
        ax = fig.axes[1]
        panels[out_png] = (ax.get_title(), [(ln.get_label(), list(ln.get_xdata()), list(ln.get_ydata()),
                                             ln.get_linestyle()) for ln in ax.get_lines()], ax.get_ylim())
        return original(plt, fig, out_png, title, dpi)

    monkeypatch.setattr(plots, "save_figure", capture)
    drift = _eps_entries(4, 3, lambda r, k, b: 0.2 + 0.4 * k * (b == 0) + 0.05 * k)
    png = plots.plot_training_curves(drift, str(tmp_path / "drift.png"), updates_per_rollout=4)
    assert (tmp_path / "drift.png").stat().st_size > 10_000
    title, lines, ylim = panels[png]
    bins = {label: (x, y) for label, x, y, _ in lines if label.startswith("bin")}
    assert bins["bin 0"][0] == [0, 1, 2, 3] and bins["bin 0"][1] == pytest.approx([0.2, 0.65, 1.1, 1.55])
    assert [y for label, _, y, style in lines if label.startswith("eps = 1") and style == "--"] == [[1.0, 1.0]]
    assert ylim[0] <= 1.0 <= ylim[1] and "void: bin 0 from k = 2, bin 1 none, bin 2 none" in title
    near = _eps_entries(4, 2, lambda r, k, b: 0.2 + 0.15 * k)  # max 0.65: below 1 but near it
    title, lines, ylim = panels[plots.plot_training_curves(near, str(tmp_path / "near.png"))]
    assert any(label.startswith("eps = 1") for label, *_ in lines) and ylim[1] > 1.0 and "lower clip kept" in title
    low = _eps_entries(4, 2, lambda r, k, b: 0.2 + 0.02 * k)
    title, lines, ylim = panels[plots.plot_training_curves(low, str(tmp_path / "low.png"), updates_per_rollout=4)]
    assert not any(label.startswith("eps = 1") for label, *_ in lines) and ylim[1] < 1.0 and "< 1" in title
    on_policy = _eps_entries(1, 4, lambda r, k, b: 0.2)
    title, lines, _ = panels[plots.plot_training_curves(on_policy, str(tmp_path / "on.png"), updates_per_rollout=1)]
    assert lines == [] and title.startswith("on-policy") and "0.20" in title


def test_the_subtitle_says_per_bin_from_which_k_its_mean_eps_passes_1():
    """Each bin on its own: one that passes 1 and stays, one that falls back below 1, one that passes only at the
    last update, one that never does (the demo's subtitle gave every bin the earliest k of any)."""
    from acpo_trl.diagnostics.plots import eps_by_update, mean_eps_by_update, void_clip_verdict

    per_bin = {0: [0.2, 1.2, 1.5, 2.0], 1: [0.2, 1.1, 1.05, 0.9], 2: [0.2, 0.5, 0.6, 0.7], 3: [0.2, 0.5, 0.9, 1.3],
               4: [0.2, 1.3, 0.9, 1.4]}
    entries = [{"step": 4 * r + k + 1, **({"reward": 0.1} if k == 0 else {}),
                **{f"acpo/bin{b}/eps": eps[k] + 0.02 * (r - 0.5) for b, eps in per_bin.items()}}
               for r in range(2) for k in range(4)]  # two rollouts of 4 updates, each 0.01 off the mean
    means = mean_eps_by_update(eps_by_update(entries, 4)[0])
    assert void_clip_verdict(means) == ("mean eps > 1, lower clip void: bin 0 from k = 1, bin 1 at k = 1-2, "
                                        "bin 2 none, bin 3 from k = 3, bin 4 at k = 1, 3")


def test_plots_draw_no_legend_without_labelled_artists(tmp_path, recwarn):
    """A panel with nothing labelled gets no legend (matplotlib warned "No artists with labels found")."""
    from acpo_trl.diagnostics.plots import plot_bins_vs_k, plot_gradient_diagnostics
    from acpo_trl.diagnostics.plots import plot_training_curves

    pos_only = [{"step": s, "grad/angle_deg": 10.0, "grad/norm_ratio": 1.0, "grad/share/bin0/pos": 0.5}
                for s in (1, 2)]
    plot_gradient_diagnostics(pos_only, str(tmp_path / "grad.png"))
    plot_bins_vs_k([{"step": 1, "diag/k0/bin0/acpo_eps": 0.2}], str(tmp_path / "bins.png"))
    plot_training_curves([{"step": 1, "reward": 0.5}], str(tmp_path / "curves.png"))
    assert not [str(w.message) for w in recwarn if "No artists with labels" in str(w.message)]


@pytest.mark.slow
def test_the_last_periodic_evaluation_is_the_after_training_one(tmp_path, tiny_dir, monkeypatch):
    """report_eval_steps dividing max_steps: the evaluation at the last step is reused as "after" (the model has
    not changed), not run twice; eval_sampler and eval_batch_size reach the evaluation; save_final_model: false
    writes no weights."""
    from acpo_trl.evaluation.callback import EvalCallback

    calls = []
    original = EvalCallback.evaluate
    monkeypatch.setattr(EvalCallback, "evaluate",
                        lambda self, *abandon: calls.append((self.sampling.sampler, self.batch_size))
                        or original(self, *abandon))
    train(write_toy_recipe(tmp_path, tiny_dir, report=True, report_eval_steps=2, save_final_model=False, eval_sampler="coupled",
                 eval_batch_size=3))
    out = tmp_path / "out"
    assert calls == [("coupled", 3)] * 3  # before, step 2, step 4 (= after), with the recipe's sampler and batch
    assert "T = 1.0 (coupled sampler)" in (out / "report.md").read_text()
    entries = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    at_end = next(e for e in entries if e["step"] == 4 and "eval/toy/avg@2" in e)
    after = json.loads((out / "eval_before_after.json").read_text())["after"]
    assert after["eval/toy/avg@2"] == at_end["eval/toy/avg@2"]
    assert not (out / "model.safetensors").exists()


@pytest.mark.slow
def test_lora_through_model_config(tmp_path, tiny_dir):
    from peft import PeftModel

    trainer = train(write_toy_recipe(tmp_path, tiny_dir, use_peft=True, lora_r=4, lora_alpha=8, learning_rate=0.05))
    model = trainer.model
    assert isinstance(model, PeftModel)
    from acpo_trl.utils.tiny_models import build_tiny_model

    reference, _ = build_tiny_model(seed=0)
    base = dict(reference.named_parameters())
    lora_moved = False
    for name, param in model.named_parameters():
        if "lora_" in name:
            assert param.requires_grad
            lora_moved |= bool(param.abs().sum() > 0) and "lora_B" in name
        else:
            assert not param.requires_grad
            key = name.replace("base_model.model.", "").replace(".base_layer", "")
            torch.testing.assert_close(param.detach(), base[key].detach())  # frozen base weights unchanged
    assert lora_moved, "lora_B started at zero and never moved"
    assert (tmp_path / "out" / "adapter_config.json").exists()


@pytest.mark.slow
def test_resume_from_checkpoint_continues_exactly(tmp_path, tiny_dir):
    from transformers import TrainerCallback

    class Interrupt(TrainerCallback):
        """Stop after step 2 (once checkpoint-2 is written), as a killed job would."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                control.should_training_stop = True

    common = dict(max_steps=6, save_strategy="steps", save_steps=2, steps_per_generation=2)
    full = train(write_toy_recipe(tmp_path / "a", tiny_dir, **common))
    partial_dir = tmp_path / "b"
    train(write_toy_recipe(partial_dir, tiny_dir, **common), callbacks=[Interrupt()])
    checkpoint = str(partial_dir / "out" / "checkpoint-2")
    resumed = train(write_toy_recipe(partial_dir, tiny_dir, **common, resume_from_checkpoint=checkpoint))

    def losses(trainer):
        return {e["step"]: e["policy_loss"] for e in trainer.state.log_history if "policy_loss" in e}

    uninterrupted, continued = losses(full), losses(resumed)
    assert sorted(continued) == [1, 2, 3, 4, 5, 6]  # steps 1-2 come from the checkpoint's trainer state
    for step in continued:
        assert continued[step] == pytest.approx(uninterrupted[step], rel=1e-5, abs=1e-7), step


def test_resume_from_checkpoint_true_from_the_command_line_takes_the_last_checkpoint(tmp_path, tiny_dir,
                                                                                       monkeypatch):
    """``--resume_from_checkpoint true`` (a string on the command line, as a requeued job passes it): the last
    checkpoint in output_dir, or a fresh start when there is none."""
    from trl import GRPOTrainer

    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    trainer = ACPOTrainer(tiny_dir, toy_reward, args=ACPOConfig(**trainer_kwargs(tmp_path)),
                          train_dataset=toy_dataset(8))
    seen = []
    monkeypatch.setattr(GRPOTrainer, "train", lambda self, resume_from_checkpoint=None: seen.append(
        resume_from_checkpoint))
    monkeypatch.setattr(ACPOTrainer, "_load_rollout_state", lambda self, path: seen.append(f"rollout of {path}"))
    trainer.train("true")
    for step in (2, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
    trainer.train("true")
    last = str(tmp_path / "checkpoint-10")
    assert seen == [None, f"rollout of {last}", last]


def test_model_card_states_acpo_settings(tmp_path, tiny_dir):
    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    args = ACPOConfig(**trainer_kwargs(tmp_path, steps_per_generation=16, acpo_alpha=1.0))
    trainer = ACPOTrainer(tiny_dir, toy_reward, args=args, train_dataset=toy_dataset(8))
    trainer.task_name = "countdown"
    trainer.create_model_card(model_name="tiny-acpo")
    card = (tmp_path / "README.md").read_text()
    for expected in ("ACPO", "2606.22570", "`epsilon` 0.2", "`acpo_alpha` 1,", "`acpo_num_bins` 5", "`acpo_clip_min` 0,",
                     "`acpo_clip_max` 3,", "`dual_clip_c` 3", "`acpo_stats_scope` local",
                     "off-policy: 16 optimizer updates per rollout", "| task | countdown |", "policy loss `acpo`"):
        assert expected in card, expected


def test_push_without_network_fails_fast_and_clearly(tmp_path, tiny_dir, monkeypatch):
    from huggingface_hub import constants

    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.utils.hub import HubUnreachableError
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    args = ACPOConfig(**trainer_kwargs(tmp_path, hub_model_id="someone/tiny-acpo"))
    trainer = ACPOTrainer(tiny_dir, toy_reward, args=args, train_dataset=toy_dataset(8))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the suite runs offline; here we want a real attempt
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    start = time.monotonic()
    with pytest.raises(HubUnreachableError, match="cannot reach the Hub at http://127.0.0.1:9"):
        trainer.push_to_hub()
    assert time.monotonic() - start < 10
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubUnreachableError, match="HF_HUB_OFFLINE"):
        trainer.push_to_hub()


@pytest.mark.slow
def test_diagnostics_switched_on_from_the_recipe(tmp_path, tiny_dir):
    trainer = train(write_toy_recipe(tmp_path, tiny_dir, max_steps=2, diagnostics=True, diagnostics_grad_every=1,
                           diagnostics_grad_params=["model.layers.1"], report=True))
    keys = {k for entry in trainer.state.log_history for k in entry}
    assert {"diag/k0/bin0/acpo_eps", "diag/k1/bin0/acpo_eps"} <= keys  # per update index k within a rollout
    assert any(k.startswith("grad/") and k.endswith("angle_deg") for k in keys)
    assert {"grad/k0/share/bin0/pos", "grad/k1/share/bin4/neg", "grad/k1/angle_deg"} <= keys  # per k too
    # the report's diagnostics plots, from the run's metrics.jsonl
    for name in ("diagnostics_bins.png", "diagnostics_gradient.png"):
        assert (tmp_path / "out" / name).stat().st_size > 10_000


def test_demo_recipe_is_the_offline_off_policy_run():
    """configs/demo.yaml (the README's main job): the packaged offline model, CPU, several updates per rollout."""
    from acpo_trl.recipe import make_parser

    script_args, training_args, model_args = make_parser().parse_args_and_config(args=["--config", "configs/demo.yaml"])
    assert model_args.model_name_or_path == "offline:smollm2"
    assert (script_args.task, script_args.report) == ("addition", True)
    assert training_args.use_cpu and training_args.policy_loss == "acpo"
    assert training_args.updates_per_rollout == 4 and not training_args.is_on_policy
    assert training_args.loss_type == "dapo"  # the per-sequence mean drifts to long completions here (demo.yaml)


def test_arithmetic_tasks_with_solved_examples_as_earlier_turns():
    import re

    from acpo_trl.data.arithmetic import ADDITION_INSTRUCTION, arithmetic_dataset

    data = arithmetic_dataset(6, 1, 0, "chat", shots=2)
    for prompt, answer in zip(data["prompt"], data["answer"]):
        assert [m["role"] for m in prompt] == ["user", "assistant", "user", "assistant", "user"]
        assert prompt[:4] == [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "\\boxed{5}"},
                              {"role": "user", "content": "What is 4 + 4?"}, {"role": "assistant", "content": "\\boxed{8}"}]
        a, b = map(int, re.fullmatch(r"What is (\d) \+ (\d)\?", prompt[-1]["content"]).groups())
        assert str(a + b) == answer
    # The same problems without examples: one turn with the instruction.
    plain = arithmetic_dataset(6, 1, 0, "chat")
    assert plain["answer"] == data["answer"]
    assert plain["prompt"][0] == [{"role": "user", "content": f"{data['prompt'][0][-1]['content']}\n{ADDITION_INSTRUCTION}"}]
    with pytest.raises(ValueError, match="arithmetic_shots=2: solved examples are earlier chat turns"):
        arithmetic_dataset(2, 1, 0, "base", shots=2)
    with pytest.raises(ValueError, match=r"arithmetic_shots=7: must be in \[0, 6\]"):
        arithmetic_dataset(2, 1, 0, "chat", shots=7)
    # A held-out set asks for distinct problems: 100 single-digit additions are then all of them, each once.
    held_out = arithmetic_dataset(100, 1, 10_000, "chat", shots=2, distinct=True)
    assert len({p[-1]["content"] for p in held_out["prompt"]}) == 100
    with pytest.raises(ValueError, match="num_eval_tasks=101: there are only 100 distinct 1-digit additions"):
        arithmetic_dataset(101, 1, 0, "chat", distinct=True)
    # Multiplication: the same problems' operands, the products, the examples multiplied.
    products = arithmetic_dataset(6, 1, 0, "chat", shots=2, op="*")
    assert products["prompt"][0][:2] == [{"role": "user", "content": "What is 2 * 3?"},
                                         {"role": "assistant", "content": "\\boxed{6}"}]
    for prompt, answer in zip(products["prompt"], products["answer"]):
        a, b = map(int, re.fullmatch(r"What is (\d) \* (\d)\?", prompt[-1]["content"]).groups())
        assert str(a * b) == answer
    assert arithmetic_dataset(1, 1, 0, "chat", op="*")["prompt"][0][0]["content"].endswith("2 * 2 = \\boxed{4}.")
    with pytest.raises(ValueError, match="only 100 distinct 1-digit multiplications"):
        arithmetic_dataset(101, 1, 0, "chat", distinct=True, op="*")


def test_before_training_evaluation_is_shared_through_a_file(tmp_path):
    """report_before_file: the first run evaluates and writes it, a later run reads it instead of evaluating."""
    from types import SimpleNamespace

    from acpo_trl.run import shared_evaluation

    accelerator = SimpleNamespace(is_main_process=True, num_processes=1)
    calls = []

    def evaluate():
        calls.append(1)
        return {"eval/t/avg@4": 0.25}

    path = str(tmp_path / "before" / "seed0.json")
    assert shared_evaluation(path, evaluate, accelerator) == {"eval/t/avg@4": 0.25}
    assert shared_evaluation(path, lambda: pytest.fail("evaluated again"), accelerator) == {"eval/t/avg@4": 0.25}
    assert shared_evaluation(None, evaluate, accelerator) == {"eval/t/avg@4": 0.25} and len(calls) == 2
    from acpo_trl.recipe import ACPOScriptArguments

    with pytest.raises(ValueError, match="report_before_file.*report: true"):
        ACPOScriptArguments(task="toy", report_before_file=path)


@pytest.mark.parametrize("low_memory,expected", [(True, 1), (False, 0)])
def test_acpo_train_on_cpu_caps_the_mmap_threshold_unless_told_not_to(tmp_path, tiny_dir, monkeypatch, low_memory,
                                                                       expected):
    import acpo_trl.train as train_module
    from acpo_trl.training.host_memory import cap_mmap_threshold

    calls = []
    monkeypatch.setattr(train_module, "cap_mmap_threshold", lambda: calls.append(1))
    trained = SimpleNamespace(accelerator=SimpleNamespace(end_training=lambda: None))  # what main ends with
    monkeypatch.setattr(train_module, "run", lambda *args, **kwargs: trained)
    train_module.main(["--config", write_toy_recipe(tmp_path, tiny_dir), "--low_memory", str(low_memory).lower()])
    assert len(calls) == expected
    assert cap_mmap_threshold()  # glibc (this Linux): the setting is accepted


def test_runs_sharing_a_before_evaluation_that_start_together_evaluate_once(tmp_path):
    """Two runs of one start (a study's cells of one seed) reach the shared before-evaluation at the same time: the
    first evaluates while the other waits, then reads its result."""
    import threading
    import time
    from types import SimpleNamespace

    from acpo_trl.run import shared_evaluation

    calls = []

    def evaluate():
        calls.append(threading.get_ident())
        time.sleep(0.3)
        return {"eval/x/avg@4": 0.5}

    single = SimpleNamespace(is_main_process=True, num_processes=1)
    path = str(tmp_path / "before" / "seed0.json")
    results = []
    threads = [threading.Thread(target=lambda: results.append(shared_evaluation(path, evaluate, single)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and results == [{"eval/x/avg@4": 0.5}] * 2
