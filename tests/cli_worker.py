"""Worker for torchrun tests of ``dare train``: ``torchrun --nproc_per_node 2 tests/cli_worker.py [OPTIONS] --
TRAIN_ARGS...``. Options: ``--sigterm-rank1-at STEP`` (rank 1 alone receives a SIGTERM inside its step STEP),
``--rank1 KEY=VALUE`` (an override given to rank 1 only; repeatable)."""

import argparse
import os
import signal
import sys

from dare.cli import main
from dare.trainer.loop import Trainer

parser = argparse.ArgumentParser()
parser.add_argument("--sigterm-rank1-at", type=int, default=0)
parser.add_argument("--rank1", action="append", default=[])
split = sys.argv.index("--") if "--" in sys.argv else 0  # torchrun drops a "--" right after the script
options, train_args = parser.parse_args(sys.argv[1:split]), sys.argv[split + 1:]
rank = int(os.environ["RANK"])

if options.sigterm_rank1_at:
    real = Trainer.train_step

    def train_step(self, index, *args, **kwargs):
        if index + 1 == options.sigterm_rank1_at and rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, index, *args, **kwargs)

    Trainer.train_step = train_step

sys.exit(main(["train", *train_args, *(options.rank1 if rank == 1 else [])]))
