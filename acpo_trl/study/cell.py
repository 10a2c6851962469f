"""The naming shared by every kind of study cell (testbed run, recipe run): its table row and its folder."""

from __future__ import annotations


class GridCell:
    """Mixin for a cell with ``task``, ``method``, ``alpha``, ``upr`` and ``seed``."""

    @property
    def variant(self) -> str:
        return self.method if self.alpha is None else f"{self.method}(alpha={self.alpha:g})"

    @property
    def run_id(self) -> str:
        alpha = "" if self.alpha is None else f"-alpha{self.alpha:g}"
        return f"{self.task}/{self.method}{alpha}/upr{self.upr}/seed{self.seed}"
