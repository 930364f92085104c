"""Worker for tests/test_interrupt_checkpoint.py: ``dare train`` under torchrun where only rank 1 receives a SIGTERM,
inside its step STEP. Run as ``torchrun --nproc_per_node 2 tests/interrupt_worker.py STEP TRAIN_ARGS...``."""

import os
import signal
import sys

from dare.cli import main
from dare.trainer.loop import Trainer

STEP = int(sys.argv[1])
real = Trainer.train_step


def train_step(self, index, *args, **kwargs):
    if index + 1 == STEP and int(os.environ["RANK"]) == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    return real(self, index, *args, **kwargs)


Trainer.train_step = train_step
sys.exit(main(["train", *sys.argv[2:]]))
