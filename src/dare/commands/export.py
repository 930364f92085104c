"""``dare export CHECKPOINT [--out DIR]``: write the weights of one ``dare train`` checkpoint as a model directory,
so that an intermediate step can be generated from and evaluated like the run's ``final/`` export.

``CHECKPOINT`` is ``RUN/checkpoints/step_N``, or a run directory (its latest checkpoint). ``--out`` (default
``RUN/exports/step_N``) must be a new or empty directory, or an earlier ``dare export`` output (replaced). A full
fine-tune gives a HF checkpoint (``--model DIR``), a LoRA run a peft adapter on the run's base model (``--adapter
DIR``), each with the tokenizer (:func:`dare.trainer.export.export_checkpoint`)."""

from __future__ import annotations

import argparse

HELP = "write the weights of one training checkpoint (RUN/checkpoints/step_N) as a model to generate from / evaluate"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="RUN/checkpoints/step_N, or a run directory (its latest checkpoint)")
    parser.add_argument("--out", default=None, help="output directory (default RUN/exports/step_N): new, empty, or "
                                                    "an earlier `dare export` output (replaced)")
    parser.add_argument("--no-progress", action="store_true", help="no download progress bars")


def run(args: argparse.Namespace) -> int:
    import shlex

    from dare.trainer.export import export_checkpoint

    out, state = export_checkpoint(args.checkpoint, args.out, progress=not args.no_progress)
    lora = (state["config"].get("lora") or {}).get("enabled")
    model = f"--adapter {shlex.quote(str(out))}" if lora else f"--model {shlex.quote(str(out))}"
    kind = "a LoRA adapter" if lora else "a full checkpoint"
    print(f"wrote {out}: the weights of step {state['step']} ({kind}); evaluate it with "
          f"`dare eval run {model} --benchmark ...`")
    return 0
