"""``acpo-eval``: avg@k / pass@k of a checkpoint on the project's benchmarks.

Example (the Δlog p paper's protocol, avg@32 = 8 seeds x 4 samples):

    acpo-eval --model_name_or_path Qwen/Qwen2.5-Math-7B --benchmarks aime24 aime25 amc23 \\
        --template chat --k 32 --seeds 0 1 2 3 4 5 6 7 --temperature 1.0 --top_p 0.7 --max_tokens 8192

Flags are ``EvalConfig``'s fields; ``--config run.yaml`` reads them from a YAML file (TRL's ``TrlParser``).
"""

from __future__ import annotations


def make_parser():
    from trl import TrlParser

    from .config import EvalConfig

    return TrlParser(EvalConfig)


def main(argv: list[str] | None = None) -> None:
    from .runner import RESULTS_JSON, RESULTS_MD, evaluate

    (config,) = make_parser().parse_args_and_config(args=argv)
    result = evaluate(config)
    print(result["table"])
    print(f"Samples and metrics: {config.output_dir}/{RESULTS_JSON}; table: {config.output_dir}/{RESULTS_MD}")


if __name__ == "__main__":
    main()
