"""Diagnostics for any policy loss: per update index and per probability bin ratio statistics, gradient direction
against the unclipped surrogate, and plots of a run's logged metrics. See ``docs/RESULTS.md`` for their cost."""

from .gradients import gradient_diagnostics, select_parameters
from .hook import DiagnosticsConfig, attach_diagnostics, gradient_step_due, update_index
from .ratio_stats import ratio_diagnostics

__all__ = [
    "DiagnosticsConfig",
    "attach_diagnostics",
    "gradient_diagnostics",
    "gradient_step_due",
    "ratio_diagnostics",
    "select_parameters",
    "update_index",
]
