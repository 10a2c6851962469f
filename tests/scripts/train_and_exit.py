"""Test helper: ``acpo-train`` (``acpo_trl.train.main``, as ``examples/train_acpo.py`` runs it) whose process then
leaves with the status ``main`` ended with, without the interpreter's finalization (``process_exit.py``), so that a
launched run's exit status is ``acpo-train``'s own, never a gloo abort's.

    accelerate launch --config_file configs/accelerate/cpu_2proc.yaml tests/scripts/train_and_exit.py --config R.yaml
"""

from __future__ import annotations

from process_exit import exit_now

from acpo_trl.train import main

if __name__ == "__main__":
    try:
        main()
        status = 0
    except SystemExit as end:
        status = end.code if isinstance(end.code, int) else 1
    exit_now(status)
