"""The ACPO study on the CPU testbed: tiny Qwen2 + noisy-teacher warm-up (:mod:`.testbed`), one process per run,
two at a time, resumable (:mod:`.runner`), the paper-style table (:mod:`.table`) and the ``acpo-study`` command
(:mod:`.cli`)."""
