"""Data loaders (``datasets.Dataset`` with a ``prompt`` column plus the reward's columns) and prompt templates."""
