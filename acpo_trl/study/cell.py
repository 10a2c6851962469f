"""The naming shared by every kind of study cell (testbed run, recipe run): its table group, row and folder."""

from __future__ import annotations

DEFAULT_LR = 5e-4  # the testbed's learning rate (docs/RESULTS.md, "Testbed"); the drift grid varies it

# What a method's name means in a study grid, where it is not the registry's method at its defaults: name ->
# (policy_loss, options it sets). The ACPO paper's baselines as its authors ran them (DAPO and the entropy methods at
# clip 0.2 / 0.3; this package's defaults when the committed grids ran, before every clip became TRL's epsilon /
# epsilon_high), the first DCPO cells' eps_low / eps_high (0.16 / 0.2), the ACPO authors' CISPO by its new name, and
# GSPO at TRL's paper-index settings. These options do not name the variant (its run id and table row are the name);
# a variant's own options override them.
STUDY_METHODS = {
    "dapo": ("dapo", (("epsilon_high", 0.3),)),
    "high_entropy": ("high_entropy", (("epsilon_high", 0.3),)),
    "low_entropy": ("low_entropy", (("epsilon_high", 0.3),)),
    "dcpo": ("dcpo", (("epsilon", 0.16), ("epsilon_high", 0.2))),
    "cispo": ("masked_cispo", ()),
    "gspo": ("ppo_clip", (("importance_sampling_level", "sequence"), ("epsilon", 3e-4), ("epsilon_high", 4e-4),
                          ("dual_clip_c", None))),
}


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
    def policy_loss(self) -> str:
        """The registry method the cell trains (``STUDY_METHODS``: a study name's method; else the name itself)."""
        return STUDY_METHODS.get(self.method, (self.method, ()))[0]

    @property
    def run_id(self) -> str:
        alpha = "" if self.alpha is None else f"-alpha{self.alpha:g}"
        clip = "" if self.clip is None else f"-clip{self.clip[0]:g}-{self.clip[1]:g}"
        options = "".join(f"-{name}{_value(value, '-')}" for name, value in self.naming_options)
        return f"{self.group}/{self.method}{alpha}{clip}{options}/upr{self.upr}/seed{self.seed}"

    def config_overrides(self) -> dict:
        """The ACPOConfig fields the cell sets beyond its method: what the study's name sets (``STUDY_METHODS``),
        alpha, the [eps_min, eps_max] clamp, the options."""
        overrides = dict(STUDY_METHODS.get(self.method, (self.method, ()))[1])
        if self.alpha is not None:
            overrides["acpo_alpha"] = self.alpha
        if self.clip is not None:
            overrides.update(acpo_clip_min=self.clip[0], acpo_clip_max=self.clip[1])
        overrides.update(getattr(self, "options", ()))
        return overrides


# Options that change what is measured, not what is trained (what is logged, the held-out evaluation): they name no
# variant, so that a run with them stays the same variant and the same row.
MEASURING_OPTIONS = ("diagnostics_", "eval_", "num_eval_tasks")


def naming_options(options) -> list[tuple[str, object]]:
    """The options that name a variant: all but the ``MEASURING_OPTIONS``, which change what is logged or evaluated,
    not what is trained."""
    return [(name, value) for name, value in options if not name.startswith(MEASURING_OPTIONS)]


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
