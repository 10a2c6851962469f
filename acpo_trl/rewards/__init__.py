"""Reward callables with TRL's signature: ``f(prompts, completions, **dataset_columns) -> list[float | None]``."""
