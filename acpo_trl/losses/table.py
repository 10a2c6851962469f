"""The registry as documentation: each method's fields and their values, from its registry entry (``reads``,
``unset``, ``summary``, ``source``), for the README's tables and the model card, so that no table is kept by hand.

``config`` is any object with ACPOConfig's fields as attributes: a run's config (its values) or its defaults."""

from __future__ import annotations

from .registry import POLICY_LOSSES, PolicyLoss

# TRL's fields that a registry method reads or refuses, in the order a TRL user knows them.
TRL_FIELDS = ("epsilon", "epsilon_high", "delta", "importance_sampling_level")


def field_value(entry: PolicyLoss, name: str, config) -> str:
    """One field as the method takes it: its value, or what an unset (None) field means under the method."""
    value = getattr(config, name)
    unset = entry.unset_for(config)
    if value is None and name == "epsilon_high":
        return f"{unset.get(name, config.epsilon):g} when unset" + ("" if name in unset else " (= epsilon)")
    if value is None:
        return "unset"
    return f"{value:g}" if isinstance(value, float) else str(value)


def method_fields(entry: PolicyLoss, config) -> str:
    """``name value`` for each field the method reads: TRL's first, then the method's own, alphabetically."""
    reads = entry.reads_for(config)
    names = [n for n in TRL_FIELDS if n in reads] + sorted(n for n in reads if n not in TRL_FIELDS)
    return ", ".join(f"`{name}` {field_value(entry, name, config)}" for name in names) or "none"


def methods_table(defaults) -> str:
    """The README's methods table: one row per registered method, its summary, source and fields with defaults."""
    rows = ["| `policy_loss` | what it changes | source | fields it reads (defaults) |", "|---|---|---|---|"]
    rows += [f"| `{name}` | {entry.summary} | {entry.source} | {method_fields(entry, defaults)} |"
             for name, entry in sorted(POLICY_LOSSES.items())]
    return "\n".join(rows) + "\n"


def trl_fields_table(defaults) -> str:
    """The README's table of TRL's clip fields per method: the value a method takes (its default), or "refused"
    (ACPOConfig refuses a non-default value under a method that does not read it), and the dual clip."""
    names = (*TRL_FIELDS, "dual_clip_c")
    rows = ["| `policy_loss` | " + " | ".join(f"`{n}`" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for name, entry in sorted(POLICY_LOSSES.items()):
        reads = entry.reads_for(defaults)
        cells = [field_value(entry, n, defaults) if n in reads else "refused" for n in names]
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"
