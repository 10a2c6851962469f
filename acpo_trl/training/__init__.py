"""What ``ACPOTrainer`` uses beyond the policy losses: the drift guard, shared-prefix scoring, the host-memory
release on CPU, the training callbacks, and the text of the run's report and model card."""
