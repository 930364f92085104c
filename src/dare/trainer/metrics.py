"""Metric sinks: ``metrics.jsonl`` (always), TensorBoard and W&B (optional extras), rank 0 only."""

from __future__ import annotations

import json
from pathlib import Path

from dare.errors import ConfigError
from dare.outputs import atomic_write_text


def truncate_jsonl(path, step: int) -> None:
    """Keep only the lines of a per-step log whose ``step`` is at most ``step`` (atomically)."""
    path = Path(path)
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    atomic_write_text(path, "".join(line + "\n" for line in kept))


WANDB_RUN_FILE = ".dare-wandb-run"
"""The W&B run id of a ``dare train`` output directory, so that a resumed run continues its W&B run."""


def wandb_run(output_dir: Path, resuming: bool) -> dict:
    """``wandb.init`` arguments: a run that resumes from a checkpoint continues the W&B run its directory recorded
    (``id``, ``resume="allow"``: W&B then takes later steps' values from it); any other run starts a new W&B run
    whose id the directory records."""
    import uuid

    record = output_dir / WANDB_RUN_FILE
    if resuming and record.is_file():
        return {"id": record.read_text().strip(), "resume": "allow"}
    run_id = uuid.uuid4().hex[:12]
    atomic_write_text(record, run_id + "\n")
    return {"id": run_id}


class MetricsLogger:
    """Append one JSON line per logged step; on resume, drop lines beyond the restored step."""

    def __init__(self, output_dir, *, enabled: bool = True, tensorboard: bool = False, wandb: bool = False,
                 wandb_project: str = "dare", config: dict | None = None, resuming: bool = False):
        self.enabled = enabled
        self.path = Path(output_dir) / "metrics.jsonl"
        self._tb = self._wandb = None
        if not enabled:
            return
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError("trainer.tensorboard=true needs tensorboard: pip install 'dare-dllm[tensorboard]'") from None
            self._tb = SummaryWriter(str(Path(output_dir) / "tensorboard"))
        if wandb:
            try:
                import wandb as wandb_lib
            except ImportError:
                raise ConfigError("trainer.wandb=true needs wandb: pip install 'dare-dllm[wandb]'") from None
            self._wandb = wandb_lib.init(project=wandb_project, config=config, dir=str(output_dir),
                                         **wandb_run(Path(output_dir), resuming))

    def truncate_after(self, step: int) -> None:
        """Keep only records with ``step <= step`` (the run restarts from that checkpoint): in ``metrics.jsonl``, and
        in TensorBoard, whose writer reopens purging the events of later steps (an interrupted run's, which the
        resumed run logs again). A resumed W&B run continues its run (:func:`wandb_run`)."""
        if not self.enabled:
            return
        truncate_jsonl(self.path, step)
        if self._tb is not None:
            from torch.utils.tensorboard import SummaryWriter

            log_dir = self._tb.log_dir
            self._tb.close()
            self._tb = SummaryWriter(log_dir, purge_step=step + 1)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        step = record["step"]
        numeric = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
