"""The ACPO study: the CPU testbed and its run (tiny Qwen2 + noisy-teacher warm-up, :mod:`.testbed`), a recipe cell
on a real model (:mod:`.recipe`), the grids (:mod:`.grids`), the worker processes that run them, two at a time,
resumable (:mod:`.runner`), the results (:mod:`.results`), a finished grid packed into one file (:mod:`.pack`), the
paper-style table (:mod:`.table`), a real model's drift measurement (:mod:`.drift`) and the ``acpo-study`` command
(:mod:`.cli`)."""
