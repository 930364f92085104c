"""``dare train CONFIG.yaml [key=value ...]``: train with a recipe (torchrun for several processes)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dare.errors import ConfigError

HELP = "train a model from a YAML recipe with key=value overrides (multi-GPU: torchrun -m dare.cli train ...)"
MEMORY_HINT = ("trainer.micro_batch_size, rollout.chunk_size (RL: rows decoded at once) or data.max_length, or set "
               "model.gradient_checkpointing=true (RL: DARE_FUSE_PROJECTIONS=0 frees the rollout engine's projection "
               "copies)")
"""What the one-line out-of-memory error names (:func:`dare.devices.out_of_memory`)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="recipe YAML or the name of a shipped recipe (e.g. "
                                                  "configs/llada/sft_tiny.yaml or llada/sft_tiny; dare recipes lists them)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides after the recipe, e.g. optim.lr=1e-5 trainer.max_steps=10")
    parser.add_argument("--show-config", action="store_true",
                        help="print every config key with its type, value and meaning (of the recipe with its overrides "
                             "when given, else the defaults; the chosen algorithm's section only), then exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate (config, model and data paths, the algorithm against the model family, "
                             "rollout sampler and reward, a data file's records (RL prompts against the reward, "
                             "SFT examples, preference pairs), "
                             "trainer.resume and trainer.output_dir; loads no model) and "
                             "print the resolved config, then exit")
    parser.set_defaults(train_parser=parser)


def take_extra(args: argparse.Namespace, extra: list[str]) -> bool:
    """Accept ``key=value`` overrides that argparse left over (e.g. after ``--dry-run``). An unknown ``--flag`` that
    names a config key (``--max-steps 5``) ends with the one-line error giving the override to write instead
    (``trainer.max_steps=5``); other leftovers get the parser's own error."""
    from dare.cli import NEGATIVE_NUMBER

    if all("=" in item and not item.startswith("-") for item in extra):
        args.overrides = [*args.overrides, *extra]
        return True
    suggested = overrides_for_flags(extra, args.train_parser)
    if suggested:
        flags = " ".join(item.split("=", 1)[0] for item in extra
                         if item.startswith("-") and not NEGATIVE_NUMBER.match(item))
        args.train_parser.error(f"unknown option {flags}: settings are key=value overrides here (use "
                                f"{' '.join(suggested)})")
    return False


def overrides_for_flags(extra: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``key=value`` for each unknown ``--flag [value]`` / ``--flag=value`` of ``extra`` that names a config key
    (``--max-steps 5`` -> ``trainer.max_steps=5``, ``--lr=1e-4`` -> ``optim.lr=1e-4``); empty when any flag names
    none, or is close to one of ``parser``'s own options (its did-you-mean error fits better)."""
    from dare.cli import NEGATIVE_NUMBER
    from dare.errors import closest

    def is_value(word: str) -> bool:  # a flag's value: a word, or a negative number (--lr -1e-3)
        return bool(word) and "=" not in word and (not word.startswith("-") or bool(NEGATIVE_NUMBER.match(word)))

    options = [option for action in parser._actions for option in action.option_strings]
    suggested = []
    for index, item in enumerate(extra):
        if not item.startswith("-") or NEGATIVE_NUMBER.match(item):
            continue
        flag, has_value, value = item.partition("=")
        if not has_value:
            following = extra[index + 1] if index + 1 < len(extra) else ""
            value = following if is_value(following) else "VALUE"
        keys = config_keys_of_flag(flag)
        habit = flag.lstrip("-").replace("-", "_") in OTHER_COMMAND_FLAGS  # not a typo of this parser's options
        if not keys or (closest(flag, options) is not None and not habit):
            return []
        suggested.append(" or ".join(f"{key}={listed(value) if is_list_key(key) else value}" for key in keys))
    return suggested


def listed(value: str) -> str:
    """``value`` as a YAML flow list (``x.py`` -> ``[x.py]``), unless it is one already."""
    return value if value.startswith("[") else f"[{value}]"


def is_list_key(key: str) -> bool:
    """True when config key ``key`` (dotted) of :class:`~dare.trainer.config.TrainConfig` holds a list."""
    import dataclasses
    import typing

    from dare.trainer.config import TrainConfig

    cls = TrainConfig
    for part in key.split("."):
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        if part not in hints:
            return False
        cls = hints[part]
    return typing.get_origin(cls) in (list, tuple)


def config_keys_of_flag(flag: str) -> list[str]:
    """The config keys option ``flag`` may stand for: the key itself (``--trainer.max_steps``), else the shallowest keys
    whose last part it spells (``--max-steps`` -> trainer.max_steps; ``--path`` -> model.path, data.path), else
    none."""
    from dare.config import config_keys
    from dare.trainer.config import TrainConfig

    name = flag.lstrip("-").replace("-", "_")
    keys = config_keys(TrainConfig)
    if name in keys:
        return [name]
    spelt = [k for k in keys if k.rpartition(".")[2] == name]
    return [k for k in spelt if k.count(".") == min(k.count(".") for k in spelt)] or OTHER_COMMAND_FLAGS.get(name, [])


OTHER_COMMAND_FLAGS = {"rl_lr": ["optim.lr"], "sft_lr": ["optim.lr"], "rl_steps": ["trainer.max_steps"],
                       "sft_max_steps": ["trainer.max_steps"], "steps": ["trainer.max_steps"],
                       "out": ["trainer.output_dir"], "out_dir": ["trainer.output_dir"],
                       "import": ["imports"]}
"""Flags of ``dare demo`` (and other habits) that spell no config key, with the keys they stand for in ``dare train``
(``--rl-lr 1e-3`` -> ``optim.lr=1e-3``; ``dare eval``'s ``--import x.py`` -> ``imports=[x.py]``)."""


def print_quietly(text: str) -> None:
    """Print ``text`` to stdout; a reader that closed the pipe early (``| head``) ends the output without a
    traceback (stdout is pointed at /dev/null so that the interpreter's final flush fails no more)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):  # a stdout without a file descriptor (e.g. captured)
            pass


def split_recipe(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """``(recipe or None, overrides)``: a first positional with ``=`` is an override, not a recipe. A recipe after
    the overrides (``dare train k=v RECIPE``), or a second recipe, is a one-line error saying where it goes."""
    import shlex

    config_path, overrides = args.config, list(args.overrides)
    if config_path is not None and "=" in config_path:
        config_path, overrides = None, [config_path, *overrides]
    python = next((item for item in overrides if "=" not in item and item.endswith(".py")), None)
    if python is not None:  # a plug-in file given bare: it goes in through the imports key
        raise ConfigError(f"{python} is Python, not a YAML recipe or a key=value override: a plug-in of your own goes "
                          f"in as imports=[{python}]")
    late = next((item for item in overrides if "=" not in item and looks_like_recipe(item)), None)
    if late is not None and config_path is not None:
        raise ConfigError(f"one recipe per run: got {config_path} and {late} (settings of another file go in as "
                          "key=value overrides)")
    if late is not None:
        flags = [*(["--show-config"] if args.show_config else []), *(["--dry-run"] if args.dry_run else [])]
        command = shlex.join([late, *(item for item in overrides if item != late), *flags])
        raise ConfigError(f"the recipe must come first, before the key=value overrides: dare train {command}")
    return config_path, overrides


def looks_like_recipe(item: str) -> bool:
    """True for a command-line word that names a recipe: a ``.yaml`` / ``.yml`` name, an existing file, or a shipped
    recipe's name (``llada/d1_tiny``; ``dare recipes`` lists them). A word with ``=`` is an override."""
    from dare.recipes import is_recipe_name

    return "=" not in item and (item.lower().endswith((".yaml", ".yml")) or Path(item).is_file()
                                or is_recipe_name(item))


def describe_values(value, default, prefix: str = "") -> list[str]:
    """``key (type) = value  # doc`` lines of config section ``value`` (dataclasses recursed, the resolved algorithm
    section included); a value that differs from ``default``'s says ``(default: D)``."""
    import dataclasses
    import typing

    from dare.config import field_docs

    lines = []
    docs, hints = field_docs(type(value)), typing.get_type_hints(type(value))
    for f in dataclasses.fields(value):
        mine, theirs = getattr(value, f.name), getattr(default, f.name, None)
        if dataclasses.is_dataclass(mine):
            if not dataclasses.is_dataclass(theirs) or type(theirs) is not type(mine):
                theirs = type(mine)()  # e.g. the algorithm section: its own class's defaults
            lines += describe_values(mine, theirs, f"{prefix}{f.name}.")
            continue
        tp = hints[f.name]
        name = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
        note = "" if mine == theirs else f" (default: {theirs!r})"
        lines.append(f"{prefix}{f.name} ({name}) = {mine!r}{note}  # {docs.get(f.name, '')}")
    return lines


def show_config(args: argparse.Namespace) -> int:
    """``--show-config``: every key of the recipe with its overrides applied (or of the defaults), the chosen
    algorithm's section only."""
    from dare.algorithms import ALGORITHMS
    from dare.trainer.config import TrainConfig, load_train_config

    config_path, overrides = split_recipe(args)
    config = load_train_config(config_path, overrides)
    given = " ".join(overrides)
    if config_path is not None:
        head = f"# {config_path}" + (f" with {given}" if given else "")
    else:
        head = ("# defaults (no recipe given)" + (f" with {given}" if given else "")
                + "; dare train RECIPE.yaml --show-config shows a recipe's values")
    name = config.algorithm.name
    others = ", ".join(n for n in sorted(ALGORITHMS) if n != name)
    lines = [head, f"# algorithm.name={name}; the other algorithms' sections: add algorithm.name=NAME ({others})",
             *describe_values(config, TrainConfig())]
    print_quietly("\n".join(lines) + "\n")
    return 0


def precheck(args: argparse.Namespace) -> None:
    """What ``dare train`` checks before torch is imported (:func:`dare.cli.main` runs it first): where the recipe
    and the overrides go, and that the recipe exists (a mistyped name answers in a fraction of a second)."""
    from dare.recipes import check_recipe, check_recipe_argument

    config_path, _ = split_recipe(args)
    if config_path is not None:
        check_recipe_argument(config_path)
        check_recipe(config_path)


def main_rank() -> bool:
    """Whether this process speaks for the run: the only one, or rank 0 of a torchrun launch."""
    return int(os.environ.get("RANK", "0")) == 0


def quiet_other_ranks() -> None:
    """Under torchrun, ranks other than 0 keep their warnings to themselves (DARE's and Python's): rank 0 says the
    same ones once. Errors still come from every rank."""
    if main_rank():
        return
    import logging
    import warnings

    logging.getLogger("dare").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")


def run(args: argparse.Namespace) -> int:
    from dare.config import to_dict
    from dare.trainer.config import load_train_config

    quiet_other_ranks()
    if args.show_config:
        return show_config(args)
    if args.config is None and not args.overrides:  # no recipe: say how to give one instead of training a default
        parser = args.train_parser
        parser.print_usage(sys.stderr)
        print(f"error: {parser.prog}: no recipe given (e.g. {parser.prog} llada/sft_tiny; dare recipes lists them); "
              f"see '{parser.prog} --help'", file=sys.stderr)
        return 2
    config_path, overrides = split_recipe(args)
    config = load_train_config(config_path, overrides)
    if args.dry_run:
        import yaml

        from dare.algorithms import get_algorithm
        from dare.trainer.preflight import check_data_records, check_run, fill_rollout_defaults

        fill_rollout_defaults(config, dry_run=True)  # downloads nothing
        check_run(config, dry_run=True)  # what a run checks before it loads the model and the data
        check_data_records(config, get_algorithm(config.algorithm.name).needs)  # the records' FILE:LINE errors
        from pathlib import Path

        from dare.trainer.config import config_dict
        from dare.trainer.output_dir import check_not_in_use
        from dare.trainer.resume import check_steps_ahead, resume_point

        # a run into an output directory another run is writing, trained with other settings, or one whose
        # trainer.resume=never would delete its own model, is refused (reads only; creates nothing)
        check_not_in_use(config.trainer.output_dir)
        start = resume_point(Path(config.trainer.output_dir), config.trainer.resume, config_dict(config))
        check_steps_ahead(start, config.trainer.max_steps)
        if not main_rank():  # one copy of the checks' result, from rank 0
            return 0
        print_quietly(yaml.safe_dump(to_dict(config), sort_keys=False))
        where = f"would resume from {start}" if start is not None else "would start at step 0"
        print(f"dry run: the checks passed; {where} in {config.trainer.output_dir} (nothing was loaded or written)",
              file=sys.stderr)
        return 0
    from dare.trainer import run_training

    rewarded: dict = {}

    def remember_reward(trainer, record: dict) -> None:
        """Keep the latest step that rolled out: inner steps (algorithm.inner_steps > 1) log no reward."""
        if "rollout/reward" in record:
            rewarded.update(step=record["step"], reward=record["rollout/reward"])

    from dare.interrupts import terminate_as_interrupt

    try:
        with terminate_as_interrupt():  # kill / scancel: the same resume hint as Ctrl-C
            record = run_training(config, on_step=remember_reward)
    except KeyboardInterrupt:  # say where to resume from; the CLI then prints "interrupted"
        if main_rank():
            from dare.progress import close_progress_bars
            from dare.trainer.resume import interrupt_message

            close_progress_bars()
            print(interrupt_message(config.trainer.output_dir, resume_command(config_path, overrides),
                                    config.trainer.resume), file=sys.stderr)
        raise
    if main_rank():
        print(run_summary(config, record, rewarded or None))
    return 0


def resume_command(config_path: str | None, overrides: list[str]) -> str:
    """The ``dare train`` command line that continues an interrupted run: the recipe and overrides, with
    ``trainer.resume=auto`` in place of any other ``trainer.resume`` (under torchrun: its launch with the same
    arguments)."""
    import shlex

    kept = [item for item in overrides if item.split("=", 1)[0].strip() != "trainer.resume"]
    words = [*([config_path] if config_path is not None else []), *kept, "trainer.resume=auto"]
    head = "torchrun ... -m dare.cli train" if "RANK" in os.environ else "dare train"
    return f"{head} {shlex.join(words)}"


def run_summary(config, record: dict, rewarded: dict | None = None) -> str:
    """The end-of-run lines: output directory, steps, the training values (RL: reward first -> last and gradient
    norm; else the loss: :func:`~dare.trainer.loop.summary_parts`), where the weights are. ``rewarded``
    (``{"step", "reward"}``): the latest step with a rollout reward, when ``record`` (an inner step) has none."""
    from pathlib import Path

    from dare.trainer.loop import summary_parts, summary_warnings

    out = Path(config.trainer.output_dir)
    parts = [f"step {record.get('step', 0)}"]
    if "time/elapsed_s" in record:
        parts.append(f"{record['time/elapsed_s']:.1f} s")
    parts += summary_parts(record, rewarded)
    lines = [f"done: {out} ({', '.join(parts)}; metrics in {out / 'metrics.jsonl'})"]
    if config.trainer.export:
        kind = "LoRA adapter" if config.lora.enabled else "HF checkpoint"
        lines.append(f"final weights ({kind}): {out / 'final'}")
    else:
        saved = sorted((out / "checkpoints").glob("step_*"))  # zero-padded step numbers
        lines.append(f"no final export (trainer.export=false); latest checkpoint: {saved[-1]}" if saved else
                     "no weights written (trainer.export=false and no checkpoint: set trainer.save_every)")
    lines += summary_warnings(record)  # steps that trained nothing, rollouts without a learning signal
    fallbacks = int(record.get("rollout/engine_fallbacks", 0))
    if fallbacks:  # a 2-15x slower rollout that would otherwise show only as a log line (e.g. a failed recording)
        lines.append(f"note: the last step's rollout decoded {fallbacks} generation call(s) with the slow eager loop "
                     "instead of CUDA graphs (the log says why; metric rollout/engine_fallbacks)")
    return "\n".join(lines)
