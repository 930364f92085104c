"""The ``dare demo`` pipeline: task -> tiny LLaDA from scratch -> SFT to partial competence -> RL -> report.

Every phase is the framework's own code path: the splits are files in the formats ``dare train`` and
``dare.eval`` read (:mod:`dare.demo.task`), the model is a ``tiny:llada``-style checkpoint written with
:func:`dare.models.tiny.write_tiny_checkpoint` (enlarged), SFT and RL are recipes (``sft.yaml``, ``rl.yaml`` in
the output directory; rerun them with ``dare train``) run by :func:`dare.trainer.run_training`, and every
accuracy is the GSM8K benchmark's scorer on the held-out split (:mod:`dare.demo.evaluation`).

SFT stops at **partial competence**: every ``sft_check_every`` steps the validation split is decoded greedily
and SFT ends at the first check with accuracy >= ``sft_target`` (or after ``sft_max_steps``). RL then starts
from that checkpoint with the chosen algorithm (``--algorithm``; ``sft`` continues SFT instead, as a baseline, at
the SFT phase's learning rate and batch: the RL-only settings, :data:`RL_ONLY`, are then an error).
The settings, their defaults and their checks: :mod:`dare.demo.settings`. Each phase's final held-out accuracy
is also the last record's ``eval/heldout_accuracy`` in its ``metrics.jsonl`` (``dare runs`` shows it).

The demo does not resume: a rerun starts every phase over. So Ctrl-C stops at once (no checkpoint is saved for a
resume that never comes: ``trainer.save_on_interrupt`` is off in the demo's runs) and says that a rerun starts over.

The output directory is marked as a demo run with its settings (:func:`dare.outputs.mark_output`). A rerun into it
replaces the earlier run when the settings are the same (saying so in one line, so rerunning ``dare demo`` just
works); a directory holding a demo run of other settings, or anything else, is a one-line error before any work
(:func:`check_out_dir`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dare.demo.settings import (BASELINE, DEVICES, FLAGS, QUICK, QUICK_SIZE, DemoConfig, check_values, resolved,
                                resolved_device, second_phase)
from dare.errors import ConfigError, unknown_choice


# Demo-sized settings per algorithm (everything else: the algorithm's paper defaults, see README). mu = 2 inner
# steps everywhere, so every algorithm gets the same number of rollouts per optimizer step; MDPO trains on 2
# sampled denoising steps of each trajectory and BGPO uses 4 MC views (8 decoding steps per answer here).
ALGORITHM_DEFAULTS: dict[str, dict] = {
    "d1": {"inner_steps": 2},
    "wd1": {"inner_steps": 2},
    "coupled_grpo": {"inner_steps": 2},
    "cj_grpo": {"inner_steps": 2},
    "spg": {"inner_steps": 2},
    "mdpo": {"inner_steps": 2, "train_steps": 2},
    "bgpo": {"inner_steps": 2, "mc_num": 4},
    "tracerl": {"inner_steps": 2},
    "justgrpo": {"inner_steps": 2, "positions_per_forward": 8},
    "espo": {"inner_steps": 2},
    "gdpo": {"inner_steps": 2},
    "dtreerpo": {"inner_steps": 2},  # 8 leaves = 2 root branches x 4; lambda(t) over the run (rl_recipe)
    "igpo": {"inner_steps": 2},
}
ROLLOUT_SAMPLER: dict[str, dict] = {
    "justgrpo": {"block_length": 1},  # left to right, one token per step (the method's rollout)
}
"""Rollout-sampler settings an algorithm requires (on top of the demo's sampler)."""
RL_ONLY = {
    "rl_lr": "continued SFT trains at the SFT learning rate ({sft_lr:g})",
    "group_size": "continued SFT trains on {sft_batch_size} demonstrations per step, not rollouts",
    "prompts_per_step": "continued SFT trains on {sft_batch_size} demonstrations per step, not rollouts",
    "temperature": "continued SFT samples no rollouts",
    "algorithm_options": "continued SFT takes no algorithm options",
}
"""Settings that only RL uses, each with why the ``sft`` baseline has no use for it: a value other than the (quick)
demo's default is an error with ``--algorithm sft``, as ``--algorithm vrpo`` is one (:func:`check_baseline`)."""
SFT_WARMUP = 20
"""Warm-up steps of an SFT run (fewer in a shorter one: :func:`warmup_steps`)."""
HELDOUT = "eval/heldout_accuracy"
"""The metric of held-out accuracy in the RL phase's ``metrics.jsonl`` (and of the final one in both phases')."""
INTERRUPTED = "note: the demo does not resume: rerunning the same command starts it over"
"""What Ctrl-C prints (the demo saves no checkpoint to resume from: :func:`load_recipe`)."""


def demo_algorithms() -> list[str]:
    """Algorithms ``--algorithm`` accepts: every registered rollout (online RL) algorithm that trains a
    full-attention model like the demo's LLaDA, plus ``sft``."""
    from dare.algorithms import ALGORITHMS

    return sorted(name for name, cls in ALGORITHMS.items() if cls.needs.rollout and _fits_llada(cls)) + [BASELINE]


def _fits_llada(cls) -> bool:
    from dare.models import FAMILIES

    return FAMILIES["llada"].attention in getattr(cls, "attentions", (FAMILIES["llada"].attention,))


def check_config(config: DemoConfig) -> None:
    """One-line errors for impossible settings (before any work), naming the flag on the command line."""
    check_values(config)
    from dare.plugins import load_plugins

    load_plugins(config.imports, "--import")  # an algorithm of your own registers before it is checked
    check_algorithm(config.algorithm)
    check_baseline(config)
    if config.device not in DEVICES:
        raise unknown_choice("device", config.device, DEVICES)
    if config.device == "cuda":
        from dare.devices import resolve_device

        resolve_device("cuda")  # "--device cuda: CUDA is not available on this machine (use --device cpu)"


def check_algorithm(name: str) -> None:
    """``name`` is one of :func:`demo_algorithms`, or a one-line error saying why not."""
    choices = demo_algorithms()
    if name in choices:
        return
    from dare.algorithms import ALGORITHMS

    cls = ALGORITHMS.get(name)
    if cls is None:
        err = f"{unknown_choice('demo algorithm', name, choices)}; an algorithm of your own loads with --import FILE.py"
        raise ConfigError(err, cli=f"{FLAGS['algorithm']}: {err}")
    why = ("trains on preference pairs, not rollouts" if not cls.needs.rollout
           else "trains block-causal models, not the demo's LLaDA")
    problem = f"{why}; the demo runs one of: {', '.join(choices)}"
    raise ConfigError(f"algorithm '{name}' {problem}", cli=f"{FLAGS['algorithm']} {name} {problem}")


def check_baseline(config: DemoConfig) -> None:
    """With ``algorithm`` ``sft`` (continued SFT), a setting of :data:`RL_ONLY` other than its default is a one-line
    error (rather than silently unused), naming its flag on the command line."""
    from dare.demo.settings import default

    if config.algorithm != BASELINE:
        return
    for name, why in RL_ONLY.items():
        if getattr(config, name) in (default(name), default(name, quick=True)):
            continue
        why = why.format(sft_lr=config.sft_lr, sft_batch_size=config.sft_batch_size)
        flag = FLAGS.get(name)
        raise ConfigError(f"{name} does not apply to algorithm '{BASELINE}': {why}",
                          cli=f"{flag} does not apply to {FLAGS['algorithm']} {BASELINE}: {why}; leave {flag} out, "
                              f"or choose an RL {FLAGS['algorithm']}" if flag else None)


# ------------------------------------------------------------------------------------------------ output directory
COMMAND = "demo"
"""The command named in the output directory's marker (``written_by: dare demo``)."""
SHOWN = 4
"""Differing settings named in the error (then "and N more")."""


def run_settings(config: DemoConfig) -> dict:
    """The settings a demo output directory records (and a rerun into it compares): every field except
    ``out_dir``, as JSON data, with the device and thread count the run uses (:func:`dare.demo.settings.resolved`:
    ``--device auto`` on a CPU machine records ``cpu``)."""
    import json

    return resolved({k: v for k, v in json.loads(json.dumps(asdict(config))).items() if k != "out_dir"})


def earlier_settings(out: Path) -> dict | None:
    """The settings of the demo run in ``out``: its marker's, else those of a ``report.json`` written before
    directories were marked; None when ``out`` holds no demo run."""
    import json

    from dare.demo.report import SCHEMA
    from dare.outputs import read_marker

    marker = read_marker(out)
    if marker.get("written_by") == f"dare {COMMAND}":
        return marker.get("settings", {})
    try:
        report = json.loads((out / "report.json").read_text())
        settings = report["settings"]["demo"] if report.get("schema") == SCHEMA else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return {k: v for k, v in settings.items() if k != "out_dir"} if isinstance(settings, dict) else None


def check_out_dir(config: DemoConfig) -> bool:
    """Check ``config.out_dir`` before any work: True when it holds an earlier demo run of the same settings (to
    be replaced), False when it is missing or empty. A demo run of other settings, or other contents, is a one-line
    :class:`ConfigError` naming the settings that differ and suggesting another ``--out``."""
    from dare.outputs import check_replaceable

    out = Path(config.out_dir).expanduser()
    saved = earlier_settings(out) if out.is_dir() else None
    if saved is None:
        return check_replaceable(out, "--out", COMMAND)  # raises for a non-empty directory of other contents
    saved, new = resolved(saved), run_settings(config)  # a marker of an earlier DARE may record device "auto"
    keys = sorted(k for k in saved.keys() | new.keys() if saved.get(k) != new.get(k))
    if not keys:
        return True
    kind = "a demo run"
    if is_quick(saved) != is_quick(new):  # the quick and the full demo in one --out: say which one is there
        kind = "a --quick demo run" if is_quick(saved) else "a full demo run (not --quick)"

    def message(names: dict) -> str:
        shown = ", ".join(f"{names.get(k, k)} {saved.get(k)} -> {new.get(k)}" for k in keys[:SHOWN])
        more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
        return (f"--out {out} holds {kind} with other settings ({shown}{more}); give another --out "
                f"(e.g. --out {out}_2), or delete {out} to replace it")

    raise ConfigError(message({}), cli=message(FLAGS))  # the command line names each setting's flag


def is_quick(settings: dict) -> bool:
    """Whether recorded demo ``settings`` (:func:`run_settings`) are those of a ``--quick`` run (its task and model
    sizes, :data:`QUICK_SIZE`)."""
    return all(settings.get(key) == QUICK[key] for key in QUICK_SIZE)


# ------------------------------------------------------------------------------------------------ recipes
def eval_sampler(config: DemoConfig):
    """Greedy decoding of the answer: LLaDA's low-confidence remasking, one token per step."""
    from dare.rollout import SamplerConfig

    length = config.digits + 3  # leading space, digits, EOS, spare
    return SamplerConfig(sampler="llada", gen_length=length, block_length=length, steps=length, temperature=0.0)


def warmup_steps(steps: int) -> int:
    """Warm-up steps of an SFT phase of ``steps`` planned steps: :data:`SFT_WARMUP`, and fewer than ``steps``, so
    that a short phase (``--quick --algorithm sft``, a small ``--sft-max-steps``) still reaches its learning rate."""
    return max(0, min(SFT_WARMUP, steps - 1))


def sft_recipe(config: DemoConfig, model: str, data, output_dir: Path, max_steps: int,
               planned: int | None = None) -> dict:
    """The SFT recipe of ``max_steps`` steps; its warm-up fits the ``planned`` steps (default ``max_steps``): SFT
    that stopped at its target is recorded with the warm-up it ran with. It records ``--import`` too: the phase ran
    with the plug-ins loaded (and it is the ``sft`` baseline's second phase)."""
    from dare.plugins import recorded

    return {
        **({"imports": recorded(config.imports)} if config.imports else {}),  # dare train SFT.yaml loads them too
        "model": {"path": str(model)},
        "data": {"path": str(data.sft), "chat_template": False, "max_length": 64},
        "algorithm": {"name": "sft", "normalize": "llada"},
        "optim": {"lr": config.sft_lr, "warmup_steps": warmup_steps(max_steps if planned is None else planned)},
        "distributed": {"device": resolved_device(config.device)},
        "trainer": {"output_dir": str(output_dir), "seed": config.seed, "batch_size": config.sft_batch_size,
                    "micro_batch_size": config.sft_batch_size, "max_steps": max_steps, "resume": "never"},
    }


def rl_recipe(config: DemoConfig, model: str, data, output_dir: Path) -> dict:
    if config.algorithm == BASELINE:
        return sft_recipe(config, model, data, output_dir, config.rl_steps)
    sampler = eval_sampler(config)
    rollouts = config.group_size * config.prompts_per_step
    algorithm = {"name": config.algorithm, **ALGORITHM_DEFAULTS.get(config.algorithm, {}), **config.algorithm_options}
    options = _option_names(config.algorithm)
    if "block_length" in options and "num_t" in options:  # SPG's masking blocks: the largest with >= num_t blocks
        from dare.algorithms import ALGORITHMS

        num_t = algorithm.get("num_t", ALGORITHMS[config.algorithm].config_class.num_t)
        length = sampler.gen_length
        algorithm.setdefault("block_length", max(d for d in range(1, length + 1)
                                                 if length % d == 0 and length // d >= min(num_t, length)))
    if "distill_horizon" in options:  # d-TreeRPO's schedules span the run (the reference: its max_steps)
        algorithm.setdefault("distill_horizon", config.rl_steps)
    from dare.plugins import recorded

    return {
        **({"imports": recorded(config.imports)} if config.imports else {}),  # dare train RL.yaml reproduces it
        "model": {"path": str(model)},
        "data": {"path": str(data.prompts), "chat_template": False},
        "algorithm": algorithm,
        "rollout": {"group_size": config.group_size, "reward": "gsm8k", "max_prompt_length": 64,
                    "sampler": {"sampler": sampler.sampler, "gen_length": sampler.gen_length,
                                "block_length": sampler.block_length, "steps": sampler.steps,
                                "temperature": config.temperature, **ROLLOUT_SAMPLER.get(config.algorithm, {})}},
        "optim": {"lr": config.rl_lr},
        "distributed": {"device": resolved_device(config.device)},
        "trainer": {"output_dir": str(output_dir), "seed": config.seed, "batch_size": rollouts,
                    "micro_batch_size": rollouts, "max_steps": config.rl_steps, "resume": "never"},
    }


def _option_names(algorithm: str) -> set[str]:
    from dataclasses import fields

    from dare.algorithms import ALGORITHMS

    return {f.name for f in fields(ALGORITHMS[algorithm].config_class)}


def write_recipe(recipe: dict, path: Path, threads: int | None) -> None:
    """Write ``recipe`` as YAML, headed by the command that reproduces the phase."""
    from dare.config import yaml_text
    from dare.outputs import atomic_write_text

    env = f"OMP_NUM_THREADS={threads} " if threads is not None else ""
    again = f"{recipe['trainer']['output_dir']}-repro"  # not the demo's own directory, which the recipe starts over
    header = (f"# Written by `dare demo`. Reproduce this phase (same weights) in {again} with:\n"
              f"#   {env}dare train {path} trainer.output_dir={again}\n")
    if threads is not None:
        header += f"# The demo pins torch to {threads} CPU thread(s): float rounding depends on the thread count.\n"
    atomic_write_text(path, header + yaml_text(recipe))


def load_recipe(recipe: dict, path: Path, threads: int | None = None):
    """Write ``recipe`` (rerun it with ``dare train PATH``) and load it exactly as ``dare train`` does, except that
    Ctrl-C stops the demo's run at once: the demo starts over when rerun, so no checkpoint is saved for it (the
    recipe keeps ``dare train``'s default)."""
    from dare.trainer import load_train_config

    write_recipe(recipe, path, threads)
    config = load_train_config(path)
    config.trainer.save_on_interrupt = False
    return config


# ------------------------------------------------------------------------------------------------ phases
@dataclass
class Phase:
    """What one phase produced: steps, held-out results, curves, times."""

    name: str
    steps: int = 0
    accuracy: float | None = None
    results_file: str | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    records: list[dict] = field(default_factory=list)
    """Every step's metrics record (as in metrics.jsonl, plus evaluations)."""


class Clock:
    """Wall and process-CPU time of a block."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def run_demo(config: DemoConfig, *, log: Callable[[str], None] = print) -> dict:
    """Run the demo; returns the report (also written to ``out_dir/report.json``). torch runs on
    ``config.threads`` CPU threads meanwhile, without transformers' progress bars (both restored after)."""
    import torch

    from dare.progress import hf_progress_bars

    check_config(config)
    if check_out_dir(config):
        log(f"--out {config.out_dir}: replacing the earlier demo run there (same settings)")
    threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        with hf_progress_bars(False):  # transformers' own bars (checkpoint writes) would break the phase lines
            return _run(config, log)
    except KeyboardInterrupt:  # the CLI then prints "interrupted"
        log(INTERRUPTED)
        raise
    finally:
        torch.set_num_threads(threads)


def log_final_accuracy(run_dir: Path, step: int, accuracy: float) -> None:
    """Add a phase's final held-out ``accuracy`` (measured on its exported checkpoint, after the run) to its
    ``metrics.jsonl`` as ``eval/heldout_accuracy`` of the last step ``step``: into that step's record when it is the
    file's last one, else as a record of its own."""
    import json

    from dare.outputs import atomic_write_text

    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    last = json.loads(lines[-1]) if lines else {}
    if last.get("step") == step:
        lines.pop()
    else:
        last = {"step": step}
    lines.append(json.dumps({**last, HELDOUT: accuracy}))
    atomic_write_text(path, "".join(line + "\n" for line in lines))


def _run(config: DemoConfig, log: Callable[[str], None]) -> dict:
    import torch

    from dare.demo.evaluation import evaluate_heldout
    from dare.demo.report import write_report
    from dare.demo.task import write_task
    from dare.models.loading import load_model, load_tokenizer
    from dare.models.tiny import write_tiny_checkpoint
    from dare.outputs import ensure_dir, mark_output
    from dare.trainer import run_training

    out = ensure_dir(config.out_dir, "--out")
    mark_output(out, COMMAND, settings=run_settings(config))  # first: an interrupted run is replaced by a rerun
    started = time.perf_counter()
    cpu_started = time.process_time()
    data = write_task(out / "data", digits=config.digits, train_size=config.train_size,
                      validation_size=config.validation_size, test_size=config.test_size, seed=config.seed)
    # init/ is this demo's own (out was checked); a run from before tiny checkpoints were marked left it unmarked,
    # which write_tiny_checkpoint would refuse
    shutil.rmtree(out / "init", ignore_errors=True)
    init = write_tiny_checkpoint("llada", out / "init", seed=config.seed, n_layers=config.layers,
                                 d_model=config.hidden, n_heads=config.heads, n_kv_heads=config.heads,
                                 mlp_hidden_size=config.mlp)
    tokenizer = load_tokenizer(str(init))
    sampler = eval_sampler(config)

    def heldout(model, name: str, samples=None, split: str = "test"):
        source = data.test_path if split == "test" else data.validation_path
        return evaluate_heldout(model, tokenizer, samples if samples is not None else data.test, sampler,
                                seed=config.seed, data={"source": str(source), "split": split, "phase": name})

    device = resolved_device(config.device)

    def final_eval(phase: Phase, model_dir: Path) -> None:
        results = heldout(load_model(str(model_dir), device=device), phase.name)
        phase.accuracy = results.metrics["accuracy"]
        phase.results_file = str(results.write(out / f"eval_{phase.name}.json"))
        if phase.steps:  # a trained phase: its metrics.jsonl ends with it (as dare runs reads it)
            log_final_accuracy(out / phase.name, phase.steps, phase.accuracy)

    # --- phase 0: the random model ---------------------------------------------------------------------
    initial = Phase("init")
    with Clock() as clock:
        final_eval(initial, init)
    initial.seconds, initial.cpu_seconds = clock.wall, clock.cpu
    n_params = sum(p.numel() for p in load_model(str(init)).parameters())
    log(f"[1/3] SFT from scratch: {n_params / 1e6:.2f}M-parameter LLaDA, until validation accuracy >= "
        f"{config.sft_target:.0%} (checked every {config.sft_check_every} steps, at most {config.sft_max_steps})")

    # --- phase 1: SFT to partial competence --------------------------------------------------------------
    sft = Phase("sft")
    reached: list[bool] = []  # per validation check: accuracy >= sft_target

    def sft_hook(trainer, record: dict) -> dict | None:
        sft.records.append(record)
        if trainer.step % config.sft_check_every and trainer.step < trainer.total_steps:
            return None
        accuracy = heldout(trainer.model, "sft", data.validation, "validation").metrics["accuracy"]
        _note(f"  SFT step {trainer.step}: loss {record['loss']:.3f}, validation accuracy {accuracy:.1%}")
        reached.append(accuracy >= config.sft_target)
        if reached[-1]:
            trainer.request_stop()
        return {"eval/validation_accuracy": accuracy}

    sft_config = load_recipe(sft_recipe(config, init, data, out / "sft", config.sft_max_steps), out / "sft.yaml",
                             config.threads)
    with Clock() as clock:
        run_training(sft_config, on_step=sft_hook)
    sft.steps = len(sft.records)
    # SFT stopped at the target: the recipe says how many steps ran (the schedule is constant after warm-up, so
    # `dare train sft.yaml` reproduces the checkpoint)
    write_recipe(sft_recipe(config, init, data, out / "sft", sft.steps, planned=config.sft_max_steps),
                 out / "sft.yaml", config.threads)
    sft.seconds, sft.cpu_seconds = clock.wall, clock.cpu
    final_eval(sft, out / "sft" / "final")
    stop = "target" if reached and reached[-1] else "step cap"
    if stop == "target":
        log(f"      SFT: {sft.steps} steps, held-out accuracy {sft.accuracy:.1%}")
    else:
        log(f"      SFT: stopped at its step cap (sft_max_steps = {sft.steps}) before validation accuracy "
            f"reached {config.sft_target:.0%}; RL starts from a weaker model. Held-out accuracy {sft.accuracy:.1%}")

    # --- phase 2: RL from the SFT checkpoint -------------------------------------------------------------
    rl = Phase("rl")
    second = second_phase(config.algorithm)
    if config.algorithm == BASELINE:
        log(f"[2/3] continued SFT instead of RL (the baseline): {config.rl_steps} steps of {config.sft_batch_size} "
            f"demonstrations at lr {config.sft_lr:g}, held-out accuracy every {config.eval_every} steps")
    else:
        log(f"[2/3] RL with {config.algorithm}: {config.rl_steps} steps, {config.prompts_per_step} prompts x "
            f"{config.group_size} rollouts, held-out accuracy every {config.eval_every} steps")

    def rl_hook(trainer, record: dict) -> dict | None:
        rl.records.append(record)
        if trainer.step % config.eval_every or trainer.step == trainer.total_steps:
            return None  # the last step is evaluated on the exported checkpoint
        accuracy = heldout(trainer.model, "rl").metrics["accuracy"]
        reward = record.get("rollout/reward")
        extra = f", rollout reward {reward:.3f}" if reward is not None else ""
        _note(f"  {second} step {trainer.step}: held-out accuracy {accuracy:.1%}{extra}")
        return {HELDOUT: accuracy}

    rl_config = load_recipe(rl_recipe(config, out / "sft" / "final", data, out / "rl"), out / "rl.yaml", config.threads)
    with Clock() as clock:
        run_training(rl_config, on_step=rl_hook)
    rl.steps = len(rl.records)
    rl.seconds, rl.cpu_seconds = clock.wall, clock.cpu
    final_eval(rl, out / "rl" / "final")
    log(f"      {second}: held-out accuracy {sft.accuracy:.1%} -> {rl.accuracy:.1%}")

    # --- report -------------------------------------------------------------------------------------------
    log("[3/3] report")
    settings = {
        "seed": config.seed, "device": device, "torch_threads": torch.get_num_threads(), "demo": asdict(config),
        "task": {"name": "reverse_digits", "digits": config.digits, "benchmark": "gsm8k", "template": "few_shot",
                 "train": config.train_size, "validation": config.validation_size, "test": config.test_size},
        "model": {"family": "llada", "layers": config.layers, "hidden": config.hidden, "heads": config.heads,
                  "mlp": config.mlp, "parameters": n_params},
        "algorithm": {"name": config.algorithm, **_section(rl_config.algorithm)},
        "sampler": {"eval": asdict(sampler.resolved()),  # every decoding setting, defaults filled in
                    "rollout": None if config.algorithm == BASELINE else asdict(rl_config.rollout.sampler.resolved())},
        # as each phase trained: the sft baseline's second phase at sft_lr (its RL-only settings are their defaults,
        # check_baseline), a short SFT phase with a shorter warm-up (warmup_steps)
        "optim": {name: {"lr": run.optim.lr, "warmup_steps": run.optim.warmup_steps}
                  for name, run in (("sft", sft_config), ("rl", rl_config))},
        "sft_stop": stop,  # "target" (validation accuracy >= sft_target) or "step cap" (sft_max_steps)
        "recipes": {"sft": str(out / "sft.yaml"), "rl": str(out / "rl.yaml")},
    }
    totals = {"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started}
    return write_report(out, settings, [initial, sft, rl], totals, log=log, quick=is_quick(run_settings(config)))


def _note(message: str) -> None:
    """A progress line that does not break the trainer's progress bar."""
    from tqdm import tqdm

    tqdm.write(message)


def _section(section) -> dict:
    return {k: v for k, v in asdict(section).items() if k != "name"}
