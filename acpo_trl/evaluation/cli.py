"""``acpo-eval``: avg@k / pass@k of a checkpoint on the project's benchmarks.

Example (the Δlog p paper's protocol, avg@32 = 8 seeds x 4 samples):

    acpo-eval --model_name_or_path Qwen/Qwen2.5-Math-7B --benchmarks aime24 aime25 amc23 \\
        --template chat --k 32 --seeds 0 1 2 3 4 5 6 7 --temperature 1.0 --top_p 0.7 --max_tokens 8192

Flags are ``EvalConfig``'s fields; ``--config run.yaml`` reads them from a YAML file (TRL's ``TrlParser``).
"""

from __future__ import annotations

from ..utils.cli_errors import cli_main, parse_config, user_input
from ..utils.hub import check_model_source
from ..utils.run_folder import claimed
from .config import EvalConfig


def make_parser():
    from trl import TrlParser  # deferred: TRL, loaded when a parser is made, not when this module is imported

    return TrlParser(EvalConfig, prog="acpo-eval")


@cli_main("acpo-eval")
def main(argv: list[str] | None = None) -> None:
    (config,) = parse_config(make_parser(), argv)
    check_model_source(config.model_name_or_path)
    if config.adapter_path:
        check_model_source(config.adapter_path, field="adapter_path", markers=("adapter_config.json",))
    # deferred: torch and TRL (the runner imports them), after the flags and the model are checked
    from .runner import RESULTS_JSON, RESULTS_MD, evaluate, load_benchmarks

    # Reading the benchmarks before the model: a bad name or file fails at once.
    hub_fix = "give a local file (NAME=PATH or --data_dir), or run once with network access to cache it"
    with user_input(FileNotFoundError, ValueError, KeyError), user_input(ConnectionError, fix=hub_fix):
        benchmarks = load_benchmarks(config)
    with claimed(config.output_dir, "acpo-eval", field="--output_dir"):
        result = evaluate(config, benchmarks=benchmarks)
    print(result["table"])
    print(f"Samples and metrics: {config.output_dir}/{RESULTS_JSON}; table: {config.output_dir}/{RESULTS_MD}")


if __name__ == "__main__":
    main()
