"""What the package's parts share that is not RL: one-line command-line errors, the number checks of the
configs, the Hub and vLLM checks, the offline SmolLM2 model and the tiny local models."""
