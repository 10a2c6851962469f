"""Pilot: one warm-up run, checkpoints saved at the given steps. usage: warm_multi.py STEPS(comma) warmup-args..."""
import sys
from transformers import TrainerCallback
from acpo_trl.warmup import WarmupArguments, run
from trl import TrlParser
steps = {int(s) for s in sys.argv[1].split(",")}
(args,) = TrlParser(WarmupArguments).parse_args_and_config(args=sys.argv[2:])
class SaveAt(TrainerCallback):
    def on_step_end(self, a, state, control, **kw):
        if state.global_step in steps:
            control.should_save = True
run(args, callbacks=[SaveAt()])
