"""Stop when told: on SIGTERM or SIGUSR1 (a scheduler's preemption), ``acpo-train`` saves a checkpoint of the
optimizer step in flight, says how to resume, and exits with a status that says why.

:class:`StopOnSignal` handles both signals while ``acpo-train`` runs (a context manager) and is its trainer's last
callback. During training the first signal is noted; at the end of each optimizer step every process learns whether
any was told to stop (a max over processes: a signal may reach only some of them), and if so the trainer saves a
checkpoint of that step (with the rollout state, so a stop within a rollout resumes exactly) and stops; a periodic
evaluation that follows the step is cut short (it asks :meth:`StopOnSignal.asked` between batches). The main
process prints one line with the command that resumes from it, and every process exits with 128 + the signal's number
(143 after SIGTERM, 138 after SIGUSR1): the status a shell reports for a process that signal ended, and the one
``accelerate launch`` exits with when it is signalled, so a scheduler reads the same status from one process or a
launch. Before training begins and after it ends (loading, the evaluations, the report, the final model) no step is
in flight: the signal ends the run at once, with the same status.

A second signal ends the process at once (the signal's default action). The same signal again within
``DUPLICATE_S`` of the first is the first one delivered twice: SLURM signals every process of a job step, and
accelerate's launcher forwards its own copy to its workers. SIGINT (Ctrl-C) keeps Python's KeyboardInterrupt.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
DUPLICATE_S = 3.0  # a forwarded copy comes within milliseconds; a person's second signal, after seconds


class StopRequested(SystemExit):
    """The run ends on a signal (raised on every process): exit status 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


class PassOn:
    """A preemption passed on to child processes (``acpo-study run``'s workers, a worker's ``acpo-train``): while in
    ``with``, SIGTERM and SIGUSR1 to this process are noted (``signum``, the first) and sent on to every child
    :meth:`add` ed, before or after the signal came; on leaving, the earlier handlers are back, and a noted signal
    raises :class:`StopRequested` once the body has ended (the caller waits for its children there)."""

    def __init__(self):
        self.signum: int | None = None
        self._children: list = []

    def __enter__(self):
        self._previous = {s: signal.signal(s, self._on_signal) for s in SIGNALS}
        return self

    def _on_signal(self, signum, frame):
        self.signum = self.signum or signum
        for child in self._children:
            child.send_signal(signum)

    def add(self, child):
        """Pass the signals on to ``child`` (a ``subprocess.Popen``), one that came while it was started too."""
        self._children.append(child)
        if self.signum:
            child.send_signal(self.signum)
        return child

    def __exit__(self, kind, error, trace):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        if error is None and self.signum:
            raise StopRequested(self.signum)
        return False


class StopOnSignal(TrainerCallback):
    """The handler of SIGTERM and SIGUSR1 while ``acpo-train`` runs (``with``), and the callback that stops its
    trainer (module docstring). ``prog`` and ``args``: the command that started the run, for the line that says how
    to resume; ``training_args``: its output folder and processes."""

    def __init__(self, prog: str, args: list[str], training_args):
        self.prog, self.args, self.training_args = prog, list(args), training_args
        self.signum: int | None = None
        self.at = 0.0  # when this process learned of it (time.monotonic)
        self.training = self.started = False
        self.stopped_at: tuple[int, int] | None = None  # (step, max_steps) of the checkpoint the stop saved

    def __enter__(self):
        self._previous = {s: signal.signal(s, self._on_signal) for s in SIGNALS}
        return self

    def __exit__(self, kind, error, trace):
        if not isinstance(error, StopRequested):
            for s, handler in self._previous.items():
                signal.signal(s, handler)
            return False
        # Stopping: the handler stays, to ignore a copy of the signal that comes late.
        state = self.training_args.distributed_state
        if state is None or state.is_main_process:
            print(self._line(), file=sys.stderr, flush=True)
        if state is not None and state.num_processes > 1:
            state.destroy_process_group()  # as acpo-train's own end does (docs/recipes.md, "Multi-node")
        return False

    def _on_signal(self, signum, frame):
        now = time.monotonic()
        if self.signum is None:
            self.signum, self.at = signum, now
            if not self.training:
                raise StopRequested(signum)
        elif signum != self.signum or now - self.at >= DUPLICATE_S:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _asked(self, args) -> int:
        """The signal any process was told to stop by (0: none), the same on every process."""
        asked = torch.tensor(self.signum or 0, device=args.device)
        if args.world_size > 1:
            torch.distributed.all_reduce(asked, op=torch.distributed.ReduceOp.MAX)
        signum = int(asked.item())
        if signum and self.signum is None:  # told through another process
            self.signum, self.at = signum, time.monotonic()
        return signum

    def asked(self) -> bool:
        """Whether any process was told to stop (every process calls it alike: it is collective). The periodic
        evaluation asks it between batches, so that a stop during it saves the step's checkpoint at once."""
        return bool(self._asked(self.training_args))

    def on_train_begin(self, args, state, control, **kwargs):
        self.training = self.started = True

    def on_step_end(self, args, state, control, **kwargs):
        if self._asked(args):
            self.stopped_at = (state.global_step, state.max_steps)
            control.should_save = control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        self.training = False
        signum = self._asked(args)  # the stop's, or one that came after the last step's end
        if signum:
            if args.world_size > 1:
                args.distributed_state.wait_for_everyone()  # every process's part of the checkpoint is written
            raise StopRequested(signum)

    def _line(self) -> str:
        name = signal.Signals(self.signum).name
        output_dir = self.training_args.output_dir
        if self.stopped_at is not None:
            step, max_steps = self.stopped_at
            checkpoint = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
            return (f"{self.prog}: stopped by {name} after step {step} of {max_steps}, checkpoint saved in "
                    f"{checkpoint}; resume with: {resume_command(self.prog, self.args, checkpoint)}")
        when = "after training, while writing its outputs" if self.started else "before training began"
        last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        if last is None:
            return f"{self.prog}: stopped by {name} {when}; run again with: {resume_command(self.prog, self.args)}"
        return (f"{self.prog}: stopped by {name} {when}; resume from its last checkpoint with: "
                f"{resume_command(self.prog, self.args, last)}")


def resume_command(prog: str, args: list[str], checkpoint: str | None = None) -> str:
    """The command that started the run (:func:`launch_command`), with ``--resume_from_checkpoint checkpoint`` in
    place of any it had (none without ``checkpoint``)."""
    command, skip = [], False
    for arg in launch_command(prog, args):
        if skip or arg.startswith("--resume_from_checkpoint="):
            skip = False
        elif arg == "--resume_from_checkpoint":
            skip = True
        else:
            command.append(arg)
    return shlex.join(command + (["--resume_from_checkpoint", checkpoint] if checkpoint else []))


def launch_command(prog: str, args: list[str]) -> list[str]:
    """``prog args``; in a worker of ``accelerate launch`` (torchrun), the launcher's own command line (its process's,
    from /proc) when it ends with ``args``, with a console script's interpreter left out."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        try:
            launcher = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode().split("\0")[:-1]
        except OSError:
            launcher = []
        if len(launcher) > len(args) and launcher[len(launcher) - len(args):] == args:
            script = os.path.basename(launcher[1])
            return [script, *launcher[2:]] if shutil.which(script) == launcher[1] else launcher
    return [prog, *args]
