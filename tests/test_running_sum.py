"""The running-sum task (acpo_trl/data/running_sum.py, acpo_trl/tasks/running_sum.py): its problems, its worked
examples, its held-out set, its reward, its registration with validated fields, and the warm-up on its worked
answers (acpo_trl/warmup.py)."""

from __future__ import annotations

import re

import pytest

from acpo_trl.data.running_sum import RunningSum, problem_numbers, worked_solution

STEP = re.compile(r"(\d+) \+ (\d+) = (\d+)")


def check_worked(numbers, text):
    """``text`` is the worked answer of ``numbers``: every step adds the next number to the running total, right."""
    steps = [tuple(map(int, s)) for s in STEP.findall(text)]
    assert [b for _, b, _ in steps] == list(numbers[1:])
    total = numbers[0]
    for a, b, s in steps:
        assert a == total and s == a + b
        total = s
    assert text.endswith(f". \\boxed{{{sum(numbers)}}}")


def check_rewritten(numbers, text):
    """``text`` is the rewrite-style answer of ``numbers``: each line is the previous one with its first two numbers
    added."""
    *lines, last = text.split("\n= ")
    rows = [list(map(int, line.split(" + "))) for line in lines]
    assert rows[0] == list(numbers)
    for before, after in zip(rows, rows[1:] + [[int(last.split(".")[0])]]):
        assert after == [before[0] + before[1], *before[2:]]
    assert last == f"{sum(numbers)}. \\boxed{{{sum(numbers)}}}"


def check_varied(numbers, text):
    """``text`` is a varied-style answer of ``numbers``: its steps, read in any of the phrasings, are the running sum."""
    from acpo_trl.data.running_sum import VARIED_STEPS

    found = []
    for phrase in VARIED_STEPS:
        pattern = re.escape(phrase)
        for name in "tns":
            pattern = pattern.replace(re.escape("{" + name + "}"), f"(?P<{name}>\\d+)")
        found += [(m.start(), int(m["t"]), int(m["n"]), int(m["s"])) for m in re.finditer(pattern, text)]
    steps = [step[1:] for step in sorted(found)]
    total = numbers[0]
    for (t, n, s), expected in zip(steps, numbers[1:]):
        assert (t, n, s) == (total, expected, total + expected)
        total = s
    assert len(steps) == len(numbers) - 1 and text.rstrip(".").endswith(f"\\boxed{{{sum(numbers)}}}")


def test_the_worked_answer_formats():
    assert worked_solution((3, 4, 2, 5)) == "3 + 4 = 7, 7 + 2 = 9, 9 + 5 = 14. \\boxed{14}"
    assert worked_solution((8, 8)) == "8 + 8 = 16. \\boxed{16}"
    assert worked_solution((3, 4, 2, 5), "rewrite") == "3 + 4 + 2 + 5\n= 7 + 2 + 5\n= 9 + 5\n= 14. \\boxed{14}"
    check_rewritten((9, 9, 1, 12, 7), worked_solution((9, 9, 1, 12, 7), "rewrite"))
    # varied: the steps of pairs, each in one of the equivalent phrasings, fixed by the numbers
    varied = {numbers: worked_solution(numbers, "varied") for numbers in [(3, 4, 2, 5), (13, 4, 22, 7, 30, 5), (1, 1, 1)]}
    assert varied[(3, 4, 2, 5)] == "3 + 4 = 7, adding 2 to 7 gives 9, 9 plus 5 is 14, so the sum is \\boxed{14}."
    for numbers, text in varied.items():
        assert worked_solution(numbers, "varied") == text
        check_varied(numbers, text)
    assert len({t.split(" ")[1] for t in varied.values()}) > 1  # not one phrasing for all


def test_datasets_shape_answers_examples_and_held_out():
    spec = RunningSum(terms=6, max_term=9, shots=2, style="pairs")
    train, held_out = spec.datasets(64, 100, seed=0)
    assert (len(train), len(held_out)) == (64, 100) and set(train.column_names) == {"prompt", "answer"}
    for prompt, answer in zip([*train["prompt"], *held_out["prompt"]], [*train["answer"], *held_out["answer"]]):
        assert [m["role"] for m in prompt] == ["user", "assistant", "user", "assistant", "user"]
        numbers = problem_numbers(prompt)
        assert len(numbers) == 6 and all(1 <= n <= 9 for n in numbers) and answer == str(sum(numbers))
        # the solved examples: their own questions and right worked answers, the same in every prompt
        for user, assistant, example in zip(prompt[0:4:2], prompt[1:4:2], spec.example_problems()):
            assert user["content"] == "What is " + " + ".join(map(str, example)) + "?"
            check_worked(example, assistant["content"])
        assert prompt[:4] == train["prompt"][0][:4]
    # held out: distinct, neither a training problem nor a solved example, from another seed
    train_problems = {problem_numbers(p) for p in train["prompt"]}
    held = [problem_numbers(p) for p in held_out["prompt"]]
    assert len(set(held)) == 100 and not set(held) & (train_problems | set(spec.example_problems()))
    assert held[:5] == spec.problems(5, 10_000)  # seed + 10_000, nothing excluded here by chance
    # the same seed, the same problems; without examples, one turn with the instruction
    again, _ = spec.datasets(64, 100, seed=0)
    assert again["prompt"] == train["prompt"]
    plain, _ = RunningSum(terms=3, max_term=20, shots=0).datasets(4, 4, seed=0)
    assert len(plain["prompt"][0]) == 1 and "\\boxed{}" in plain["prompt"][0][0]["content"]
    assert max(max(problem_numbers(p)) for p in plain["prompt"]) <= 20
    rewrite = RunningSum(terms=5, max_term=9, shots=3, style="rewrite")
    for prompt in rewrite.dataset(rewrite.problems(4, seed=0))["prompt"]:
        for user, assistant, example in zip(prompt[0:6:2], prompt[1:6:2], rewrite.example_problems()):
            assert problem_numbers([user]) == example
            check_rewritten(example, assistant["content"])
    base, _ = RunningSum(terms=3, max_term=20, shots=0, template="base").datasets(4, 4, seed=0)
    assert isinstance(base["prompt"][0], str) and problem_numbers(base["prompt"][0]) == problem_numbers(plain["prompt"][0])
    # unique: no number twice in a problem (examples included)
    unique = RunningSum(terms=6, max_term=9, shots=2, style="pairs", unique=True)
    assert all(len(set(p)) == 6 for p in unique.problems(50, seed=0) + unique.example_problems())
    with pytest.raises(ValueError, match=r"num_eval_tasks=5: only 4 running sums of 2 numbers in 1..2"):
        RunningSum(terms=2, max_term=2, shots=0).datasets(0, 5, seed=0)
    with pytest.raises(ValueError, match=r"num_eval_tasks=3: only 2 running sums of 2 numbers in 1..2"):
        RunningSum(terms=2, max_term=2, shots=0, unique=True).datasets(0, 3, seed=0)


def test_only_the_final_box_is_rewarded_and_malformed_text_scores_zero():
    from acpo_trl.rewards.math import math_reward

    numbers = (7, 7, 1, 5, 9, 8)
    right = worked_solution(numbers)
    completions = [
        right,
        "7 + 7 = 15, 15 + 1 = 16. \\boxed{37}",  # wrong steps, right total: the steps are not checked
        right.replace("\\boxed{37}", "\\boxed{36}"),
        right[:-1],  # cut before the box closes
        "7 + 7 = 14, 14 + 1 = 15",  # no box
        "\\boxed{}",
        "\\boxed{3 +}",
        "",
    ]
    scores = math_reward(completions=[[{"role": "assistant", "content": c}] for c in completions],
                         answer=["37"] * len(completions))
    assert scores == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_registered_task_and_its_validated_fields():
    from acpo_trl.tasks import build_task, registered
    from acpo_trl.recipe import script_arguments

    ACPOScriptArguments = script_arguments()
    assert "running_sum" in registered()
    args = ACPOScriptArguments(task="running_sum", prompt_template="chat", num_train_tasks=8, num_eval_tasks=4,
                               running_sum_terms=4, running_sum_max_term=5, running_sum_shots=1)
    task = build_task(args, seed=3)
    assert (len(task.train_dataset), len(task.eval_dataset)) == (8, 4)
    assert [f.__name__ for f in task.reward_funcs] == ["math_reward"]
    assert all(len(problem_numbers(p)) == 4 for p in task.eval_dataset["prompt"])
    for fields, message in [
        (dict(running_sum_terms=1), r"running_sum_terms=1: a running sum needs at least 2 numbers"),
        (dict(running_sum_max_term=0), r"running_sum_max_term=0: .* give at least 1"),
        (dict(running_sum_shots=9), r"running_sum_shots=9: must be in \[0, 8\]"),
        (dict(prompt_template="base", running_sum_shots=2), r"running_sum_shots=2: .* set prompt_template: chat"),
        (dict(running_sum_unique=True, running_sum_max_term=5), r"running_sum_unique=True: 6 different numbers "
                                                                 r"need running_sum_max_term >= 6"),
        (dict(running_sum_style="columns"), r"running_sum_style='columns': use one of \('pairs', 'rewrite', 'varied'\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            ACPOScriptArguments(task="running_sum", **{"prompt_template": "chat", **fields})
    ACPOScriptArguments(task="addition", running_sum_terms=1)  # another task's run ignores the fields


def test_warmup_trains_on_worked_answers_that_avoid_the_held_out_problems(tmp_path, tiny_dir):
    """`acpo-warmup --recipe R`: SFT on the recipe's task, saved where R's model_name_or_path points."""
    import json

    import yaml

    from acpo_trl.tasks.running_sum import spec as running_sum_spec
    from acpo_trl.recipe import script_arguments
    from acpo_trl.warmup import WarmupArguments, main, warmup_dataset

    ACPOScriptArguments = script_arguments()
    recipe = tmp_path / "recipe.yaml"
    task = dict(task="running_sum", prompt_template="chat", running_sum_terms=3, running_sum_max_term=4,
                running_sum_shots=0, num_train_tasks=16, num_eval_tasks=8)
    recipe.write_text(yaml.safe_dump({"model_name_or_path": str(tmp_path / "warm"), **task}))
    args = WarmupArguments(recipe=str(recipe), base_model=tiny_dir, num_examples=20, max_steps=2, batch_size=4,
                           exclude_seeds=2)
    script_args = ACPOScriptArguments(**task)
    data = warmup_dataset(script_args, args)
    spec = running_sum_spec(script_args)
    held_out = {p for seed in (0, 1) for p in spec.held_out_problems(16, 8, seed)[1]}
    problems = [problem_numbers(p) for p in data["prompt"]]
    assert len(set(problems)) == 20 and not set(problems) & held_out
    for numbers, completion in zip(problems, data["completion"]):
        assert completion == [{"role": "assistant", "content": worked_solution(numbers, "varied")}]
    main(["--recipe", str(recipe), "--base_model", tiny_dir, "--num_examples", "20", "--max_steps", "2",
          "--batch_size", "4", "--exclude_seeds", "2"])
    saved = json.loads((tmp_path / "warm" / "warmup.json").read_text())
    assert (saved["task"], saved["num_rows"], len(saved["loss"])) == ("running_sum", 20, 2)
    assert (tmp_path / "warm" / "config.json").is_file() and (tmp_path / "warm" / "tokenizer_config.json").is_file()
    with pytest.raises(SystemExit):  # a recipe whose model is the base model has no warm-up folder to write
        recipe.write_text(yaml.safe_dump({"model_name_or_path": "offline:smollm2", **task}))
        main(["--recipe", str(recipe)])


def test_acpo_eval_with_a_recipe_scores_the_recipes_held_out_set(tmp_path, tiny_dir, capsys):
    """`acpo-eval --recipe R --benchmarks running_sum`: the problems R's run reports on (its task fields, its counts,
    its seed), not the default options' ones; a recipe whose task or template the command does not match is refused."""
    import json

    import yaml

    from acpo_trl.evaluation.cli import main
    from acpo_trl.evaluation.config import EvalConfig
    from acpo_trl.evaluation.runner import load_benchmarks
    from acpo_trl.tasks import build_task
    from acpo_trl.recipe import script_arguments

    fields = dict(task="running_sum", prompt_template="chat", running_sum_terms=3, running_sum_max_term=20,
                  num_train_tasks=16, num_eval_tasks=6)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model_name_or_path": tiny_dir, "seed": 5, **fields}))
    expected = build_task(script_arguments()(**fields), seed=5).eval_dataset["prompt"]
    config = EvalConfig(model_name_or_path=tiny_dir, benchmarks=["running_sum"], template="chat", recipe=str(recipe))
    assert load_benchmarks(config)[0].dataset["prompt"] == expected
    default = load_benchmarks(EvalConfig(model_name_or_path=tiny_dir, benchmarks=["running_sum"], template="chat"))
    assert len(default[0].dataset) == 64 and not set(map(str, expected)) & set(map(str, default[0].dataset["prompt"]))

    out = tmp_path / "eval"
    main(["--model_name_or_path", tiny_dir, "--benchmarks", "running_sum", "--recipe", str(recipe), "--template", "chat",
          "--k", "1", "--max_tokens", "4", "--backend", "transformers", "--output_dir", str(out)])
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["recipe"] == str(recipe)
    assert results["metrics"]["running_sum"]["num_problems"] == 6
    capsys.readouterr()
    for argv, message in [
        (["--benchmarks", "addition", "--template", "chat"], "trains task 'running_sum', which --benchmarks does not "
                                                            "name: add `--benchmarks running_sum`"),
        (["--benchmarks", "running_sum"], "EvalConfig.template='base': the recipe's prompts are 'chat'; give "
                                          "`--template chat`"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main(["--model_name_or_path", tiny_dir, "--recipe", str(recipe), "--output_dir", str(out), *argv])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(("seed", "digest"), [(0, "b5e62cdef4011b0b"), (7, "93019528315c179a")])
def test_the_study_recipe_holds_out_500_problems_keeping_its_first_100_and_its_training_set(seed, digest):
    """configs/study/smollm2_running_sum.yaml at num_eval_tasks 500 (issue 60's larger held-out set): 500 distinct
    problems, none a training problem or a solved example, whose first 100 are the recipe's own 100; the training
    set does not move. The digest pins the problems of the committed study (its training set and its 100)."""
    import dataclasses
    import hashlib
    import json

    from acpo_trl.tasks import build_task
    from acpo_trl.tasks.running_sum import spec
    from acpo_trl.recipe import read_recipe

    script_args, _, _ = read_recipe("configs/study/smollm2_running_sum.yaml")
    assert script_args.num_eval_tasks == 100

    def problems(args):
        task = build_task(args, seed=seed)
        return [[problem_numbers(p) for p in data["prompt"]] for data in (task.train_dataset, task.eval_dataset)]

    train, held_out = problems(script_args)
    assert hashlib.sha256(json.dumps([train, held_out]).encode()).hexdigest()[:16] == digest
    larger_train, larger = problems(dataclasses.replace(script_args, num_eval_tasks=500))
    assert larger_train == train and larger[:100] == held_out and len(set(larger)) == 500
    assert not set(larger) & (set(train) | set(spec(script_args).example_problems()))
