"""The training workflow: config, batch sources, loop, optimizer/scheduler, checkpoints, metrics."""

from dare.trainer.config import TrainConfig, load_train_config
from dare.trainer.loop import Trainer, run_training
from dare.trainer.sources import BatchSource, DatasetSource

__all__ = ["BatchSource", "DatasetSource", "TrainConfig", "Trainer", "load_train_config", "run_training"]
