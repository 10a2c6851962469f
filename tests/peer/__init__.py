"""TRL's own GRPO tests run against ACPOTrainer (a package, so that its fixtures are scoped to it)."""
