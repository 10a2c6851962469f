"""The naming shared by every kind of study cell (testbed run, recipe run): its table group, row and folder."""

from __future__ import annotations

DEFAULT_LR = 5e-4  # the testbed's learning rate (docs/RESULTS.md, "Testbed"); the drift grid varies it


class GridCell:
    """Mixin for a cell with ``task``, ``method``, ``alpha``, ``clip``, ``upr`` and ``seed`` (and, on the testbed,
    ``lr``: a learning rate other than the testbed's names a drift level of its own; on a recipe, ``options``: other
    ACPOConfig fields the variant sets, as (name, value) pairs)."""

    @property
    def group(self) -> str:
        """The table section: the task, with the learning rate when it is not the testbed's (a drift level)."""
        lr = getattr(self, "lr", DEFAULT_LR)
        return self.task if lr == DEFAULT_LR else f"{self.task}@lr{lr:g}"

    @property
    def naming_options(self) -> list[tuple[str, object]]:
        """The options that name the variant (:func:`naming_options`)."""
        return naming_options(getattr(self, "options", ()))

    @property
    def variant(self) -> str:
        """The table row (:func:`variant_label`)."""
        return variant_label(self.method, self.alpha, self.clip, getattr(self, "options", ()))

    @property
    def run_id(self) -> str:
        alpha = "" if self.alpha is None else f"-alpha{self.alpha:g}"
        clip = "" if self.clip is None else f"-clip{self.clip[0]:g}-{self.clip[1]:g}"
        options = "".join(f"-{name}{_value(value, '-')}" for name, value in self.naming_options)
        return f"{self.group}/{self.method}{alpha}{clip}{options}/upr{self.upr}/seed{self.seed}"

    def config_overrides(self) -> dict:
        """The ACPOConfig fields the cell sets beyond its method: alpha, the [eps_min, eps_max] clamp, the options."""
        overrides = {} if self.alpha is None else {"acpo_alpha": self.alpha}
        if self.clip is not None:
            overrides.update(acpo_clip_min=self.clip[0], acpo_clip_max=self.clip[1])
        overrides.update(getattr(self, "options", ()))
        return overrides


def naming_options(options) -> list[tuple[str, object]]:
    """The options that name a variant: all but the ``diagnostics_*`` fields, which change what is logged, not what
    is trained."""
    return [(name, value) for name, value in options if not name.startswith("diagnostics_")]


def variant_label(method: str, alpha: float | None = None, clip: tuple[float, float] | None = None,
                  options=()) -> str:
    """A variant's table row: the method, with ACPO's alpha and clip clamp when they are not the defaults, and the
    variant's other options, e.g. ``acpo(alpha=1, clip=[0.05, 0.5])`` or ``ppo_clip(epsilon=0.43)``."""
    named = [] if alpha is None else [f"alpha={alpha:g}"]
    named += [] if clip is None else [f"clip=[{clip[0]:g}, {clip[1]:g}]"]
    named += [f"{name}={_value(value, '/')}" for name, value in naming_options(options)]
    return method if not named else f"{method}({', '.join(named)})"


def _value(value, sep: str) -> str:
    """An option's value in a name: a number as %g, a list joined by ``sep``."""
    if isinstance(value, (list, tuple)):
        return sep.join(_value(v, sep) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)
