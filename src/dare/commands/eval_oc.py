"""``dare eval opencompass ARGS...``: run OpenCompass's own CLI with one-line errors for loading mistakes.

Every argument after ``opencompass`` goes to OpenCompass unchanged (``CONFIG -w WORK_DIR``, ``--datasets ...``;
``--help`` shows the DARE plug-in's settings, then OpenCompass's help). OpenCompass loads models and datasets in
task subprocesses, where a mistake becomes a traceback in a task log and a ``-`` in the summary, with exit status
0. This command instead:

1. loads the config and checks it before OpenCompass starts (:func:`dare.eval.opencompass_checks.check_config`:
   DARE model arguments, checkpoint paths, custom dataset files; ``--datasets`` names; a ``read_base()``
   import of a dataset config that does not exist);
2. runs OpenCompass, with a missing data file it meets in its own process as a one-line error;
3. if OpenCompass reported failed tasks, ends with ``error: OpenCompass task T failed: CAUSE (log: PATH)``
   (the error that ended the task's log) and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import os

HELP = "run OpenCompass with DARE's model plug-in and one-line loading errors (all further arguments go to OpenCompass)"


HELP_PREAMBLE = [
    "dare eval opencompass: OpenCompass's command line with DARE's model plug-in and one-line loading errors.",
    "  A config's models use type=DareDiffusionModel (dare.eval.opencompass) with path=CHECKPOINT|HUB_NAME|"
    "tiny:FAMILY,",
    "  optional adapter=DIR and sampler={...} (SamplerConfig fields); see configs/opencompass/eval_dare_tiny.py.",
    "  e.g. dare eval opencompass configs/opencompass/eval_dare_tiny.py -w runs/oc",
    "  Every argument goes to OpenCompass unchanged; OpenCompass's own help follows.",
]
"""DARE's lines before OpenCompass's ``--help``."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(opencompass_args=[], eval_parser=parser)


def take_extra(args: argparse.Namespace, extra: list[str]) -> bool:
    args.opencompass_args = [*args.opencompass_args, *extra]
    return True


class FailedTasks(logging.Handler):
    """Collects ``(task, log path)`` of the tasks OpenCompass's runner reports as failed."""

    def __init__(self):
        super().__init__(level=logging.ERROR)
        self.failures: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        from dare.eval.opencompass_checks import failed_task

        failure = failed_task(record.getMessage())
        if failure is not None:
            self.failures.append(failure)


def check_invocation(options: argparse.Namespace) -> None:
    """The checks that need no model loaded: the config (or ``--datasets`` names / ``--custom-dataset-path``)."""
    from dare.eval.opencompass_checks import check_config, check_dataset_config, check_dataset_names

    if options.config:
        check_config(load_config(options.config))
        return
    if options.datasets:
        import opencompass

        builtin = os.path.join(os.path.dirname(opencompass.__file__), "configs")
        check_dataset_names(options.datasets, [os.path.join(root, sub) for root in (options.config_dir, builtin)
                                               for sub in ("datasets", "dataset_collections")])
    elif getattr(options, "custom_dataset_path", None):
        check_dataset_config({"path": options.custom_dataset_path})


def load_config(path: str):
    """The OpenCompass config at ``path`` as OpenCompass loads it; a missing file or a ``read_base()`` import of
    a config that does not exist is a one-line error."""
    from mmengine.config import Config
    from mmengine.config.utils import ConfigParsingError

    from dare.errors import ConfigError
    from dare.eval.opencompass_checks import missing_base_config

    if not os.path.isfile(path):
        raise ConfigError(f"OpenCompass config {path}: no such file")
    try:
        return Config.fromfile(path, format_python_code=False)
    except ConfigParsingError as err:
        message = missing_base_config(str(err), path)
        if message is None:
            raise
        raise ConfigError(message) from None


def run(args: argparse.Namespace) -> int:
    from dare.commands.passthrough import asks_for_help, exit_status, print_preamble, program_argv
    from dare.errors import DareError, InputError, first_line
    from dare.eval.opencompass import opencompass_missing, require_opencompass
    from dare.eval.opencompass_checks import failure_message

    if asks_for_help(args.opencompass_args):
        missing = opencompass_missing()
        if missing is not None:  # the help is DARE's part alone (no OpenCompass help follows), not an error
            print_preamble(HELP_PREAMBLE[:-1])
            print(missing)
            return 0
        print_preamble(HELP_PREAMBLE)
    require_opencompass()
    from opencompass.cli.main import main, parse_args
    from opencompass.utils import get_logger

    with program_argv("opencompass", args.opencompass_args):
        try:
            options = parse_args()
        except SystemExit as exit_:  # --help, or a usage error argparse has printed
            return exit_status(exit_)
        check_invocation(options)
        # OpenCompass's main() makes its logger at this level on first use; the runners log failed tasks there
        logger = get_logger(log_level="DEBUG" if options.debug or options.dry_run else "INFO")
        failed = FailedTasks()
        logger.addHandler(failed)
        try:
            main()
        except SystemExit as exit_:
            return exit_status(exit_)
        except DareError:
            raise
        except FileNotFoundError as err:  # a dataset read in OpenCompass's own process (custom datasets, --debug)
            raise InputError(f"OpenCompass could not load a dataset: {first_line(err)}") from None
        finally:
            logger.removeHandler(failed)
    if failed.failures:
        raise InputError(failure_message(failed.failures))
    return 0
