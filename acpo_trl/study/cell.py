"""The naming shared by every kind of study cell (testbed run, recipe run): its table group, row and folder."""

from __future__ import annotations

DEFAULT_LR = 5e-4  # the testbed's learning rate (docs/RESULTS.md, "Testbed"); the drift grid varies it


class GridCell:
    """Mixin for a cell with ``task``, ``method``, ``alpha``, ``clip``, ``upr`` and ``seed`` (and, on the testbed,
    ``lr``: a learning rate other than the testbed's names a drift level of its own)."""

    @property
    def group(self) -> str:
        """The table section: the task, with the learning rate when it is not the testbed's (a drift level)."""
        lr = getattr(self, "lr", DEFAULT_LR)
        return self.task if lr == DEFAULT_LR else f"{self.task}@lr{lr:g}"

    @property
    def variant(self) -> str:
        """The table row: the method, with ACPO's alpha and clip clamp when they are not the defaults."""
        options = [] if self.alpha is None else [f"alpha={self.alpha:g}"]
        options += [] if self.clip is None else [f"clip=[{self.clip[0]:g}, {self.clip[1]:g}]"]
        return self.method if not options else f"{self.method}({', '.join(options)})"

    @property
    def run_id(self) -> str:
        alpha = "" if self.alpha is None else f"-alpha{self.alpha:g}"
        clip = "" if self.clip is None else f"-clip{self.clip[0]:g}-{self.clip[1]:g}"
        return f"{self.group}/{self.method}{alpha}{clip}/upr{self.upr}/seed{self.seed}"

    def config_overrides(self) -> dict:
        """The ACPOConfig fields the cell sets beyond its method: alpha and the [eps_min, eps_max] clamp."""
        overrides = {} if self.alpha is None else {"acpo_alpha": self.alpha}
        if self.clip is not None:
            overrides.update(acpo_clip_min=self.clip[0], acpo_clip_max=self.clip[1])
        return overrides
