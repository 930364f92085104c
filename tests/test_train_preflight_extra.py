"""`dare train` defects of a user audit: the dry run fails with the run's error for the algorithm against the model
family and the attention backend on CPU; duplicate YAML keys and empty recipes are one-line errors; a locked or
foreign output directory is refused before anything is written; Ctrl-C names the latest checkpoint and the resume
override."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare.cli import main
from dare.config import load_yaml
from dare.errors import ConfigError
from dare.outputs import OUTPUT_MARKER, mark_output
from dare.trainer import output_dir as output_dir_module
from dare.trainer.output_dir import LOCK_FILE, OutputLock, check_not_in_use
from dare.trainer.resume import interrupt_message

ROOT = Path(__file__).resolve().parents[1]
SFT = str(ROOT / "configs/llada/sft_tiny.yaml")
SMALL = ["trainer.progress=false", "data.num_examples=8", "data.max_length=32", "trainer.batch_size=4",
         "trainer.micro_batch_size=4", "trainer.max_steps=1", "optim.scheduler=constant", "optim.warmup_steps=0",
         "distributed.device=cpu"]


def train(capsys, out, *overrides) -> str:
    assert main(["train", SFT, f"trainer.output_dir={out}", *SMALL, *overrides]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


# ---- A. the dry run fails where the run does ----------------------------------------------------------------------
CASES = {
    "ebpo on a full-attention family": (
        ["configs/llada/d1_tiny.yaml", "algorithm.name=ebpo"],
        "error: algorithm 'ebpo' needs a block-causal model family (llada2, sdar, sdar_moe); llada is full"),
    "espo on a block-causal family": (
        ["configs/sdar/d1_tiny.yaml", "algorithm.name=espo"],
        "error: algorithm 'espo' needs a full model family (dream, llada, llada_moe); sdar is block-causal"),
    "block_size on a full-attention family": (
        ["configs/llada/sft_tiny.yaml", "algorithm.block_size=8"],
        "error: algorithm.block_size applies to block-causal families (llada2, sdar, sdar_moe); llada uses full "
        "attention"),
    "flex attention on CPU": (
        ["configs/llada/sft_tiny.yaml", "model.attn_backend=flex", "distributed.device=cpu"],
        "error: model.attn_backend=flex cannot train on CPU (flex has no CPU backward, varlen needs CUDA); use sdpa "
        "or eager"),
    "varlen attention on CPU": (
        ["configs/llada/sft_tiny.yaml", "model.attn_backend=varlen", "distributed.device=cpu"],
        "error: model.attn_backend=varlen cannot train on CPU (flex has no CPU backward, varlen needs CUDA); use sdpa "
        "or eager"),
    "sequence parallelism without FSDP": (
        ["configs/llada/sft_tiny.yaml", "distributed.sequence_parallel=2", "distributed.fsdp=false"],
        "error: distributed.sequence_parallel > 1 needs distributed.fsdp=true (FSDP2 sums the gradients of the "
        "sequence shards)"),
    "expert parallelism on a dense model": (  # before: "needs a torchrun launch", which would not have helped
        ["configs/llada/sft_tiny.yaml", "distributed.expert_parallel=2"],
        "error: distributed.expert_parallel > 1 needs a mixture-of-experts model (no MoE layer found)"),
}


@pytest.mark.parametrize("case", CASES)
def test_the_dry_run_fails_with_the_runs_error(case, tmp_path, capsys):
    (recipe, *overrides), expected = CASES[case]
    args = ["train", str(ROOT / recipe), *overrides, f"trainer.output_dir={tmp_path / 'run'}"]
    assert one_line_error(capsys, *args, "--dry-run") == expected
    assert one_line_error(capsys, *args) == expected
    assert not (tmp_path / "run").exists()  # refused before the output directory is made


@pytest.mark.parametrize("overrides, expected", [
    (["configs/llada/sft_tiny.yaml", "distributed.sequence_parallel=2"],
     "error: distributed.sequence_parallel=2 must divide the number of processes (1); launch with torchrun "
     "--nproc_per_node a multiple of it"),
    (["configs/llada2/sft_tiny.yaml", "distributed.expert_parallel=2"],
     "error: distributed.expert_parallel=2 needs a torchrun launch (e.g. torchrun --nproc_per_node 2 -m dare.cli "
     "train ...)"),
])
def test_a_dry_run_without_torchrun_leaves_the_launch_checks_to_the_launch(overrides, expected, tmp_path, capsys,
                                                                           caplog):
    """Before: the README's own sequence-parallel recipe failed its dry run (one process is not the launch)."""
    (recipe, *rest) = overrides
    args = ["train", str(ROOT / recipe), *rest, f"trainer.output_dir={tmp_path / 'run'}"]
    assert main([*args, "--dry-run"]) == 0
    assert "note: a dry run without torchrun checks what does not depend on the number of processes" in caplog.text
    capsys.readouterr()
    assert one_line_error(capsys, *args) == expected  # the run itself, in one process


@pytest.mark.parametrize("recipe, world, overrides, expected", [
    ("llada/sft_tiny", 4, ["distributed.sequence_parallel=3"],
     "error: distributed.sequence_parallel=3 must divide the number of processes (4); launch with torchrun "
     "--nproc_per_node a multiple of it"),
    ("llada/sft_tiny", 6, ["distributed.sequence_parallel=3"],
     "error: distributed.sequence_parallel=3 must divide the model's 4 attention heads"),
    ("llada/sft_tiny", 4, ["distributed.sequence_parallel=4", "model.path=tiny:dream"], None),  # 2 KV heads repeated
    ("llada2/sft_tiny", 4, ["distributed.expert_parallel=8"],
     "error: distributed.expert_parallel=8 must divide the world size 4"),
    ("llada2/sft_tiny", 4, ["distributed.expert_parallel=3"],  # the model's experts first: no launch fixes that
     "error: distributed.expert_parallel=3 must divide the number of experts 8"),
    ("llada/sft_tiny", 2, ["distributed.fsdp=false"],  # before: each rank trained its own copy, no word
     "error: distributed.fsdp=false under torchrun with 2 processes: each would train its own copy of the model on "
     "its share of the batch (nothing sums their gradients); use distributed.fsdp=true (the default) or one process"),
    ("llada/sft_tiny", 2, ["trainer.batch_size=15"],  # before: found once the model had loaded
     "error: trainer.batch_size=15 must be divisible by the number of processes (2)"),
    ("llada/sft_tiny", 4, ["trainer.batch_size=15", "distributed.sequence_parallel=2"],
     "error: trainer.batch_size=15 must be divisible by the number of data-parallel groups (2 = 4 processes / "
     "distributed.sequence_parallel=2)"),
    ("llada/d1_tiny", 2, ["trainer.batch_size=12", "rollout.group_size=4"],
     "error: prompts per step (3 = trainer.batch_size / rollout.group_size) must be divisible by the number of "
     "processes (2)"),
    ("llada/sft_tiny", 2, ["distributed.backend=nccl", "distributed.device=cpu"],
     "error: distributed.backend=nccl on cpu: it runs on CUDA devices only; use distributed.backend=auto (gloo on "
     "the CPU, NCCL on CUDA)"),
    ("llada2/sft_tiny", 6, ["distributed.expert_parallel=3"],
     "error: distributed.expert_parallel=3 must divide the number of experts 8"),
    ("llada/sft_tiny", 4, ["distributed.expert_parallel=2"],
     "error: distributed.expert_parallel > 1 needs a mixture-of-experts model (no MoE layer found)"),
    ("sdar/bgpo_tiny", 4, ["distributed.expert_parallel=2", "model.path=tiny:sdar_moe"],
     "error: distributed.expert_parallel > 1 does not support RL rollouts yet (ranks decode different numbers of "
     "forwards; the expert all-to-all needs every rank in step)"),
    ("llada2/sft_tiny", 4, ["distributed.expert_parallel=4"], None),
    ("sdar/tracerl_tiny", 2, ["distributed.sequence_parallel=2"],  # before: refused only once the models loaded
     "error: algorithm tracerl trains auxiliary models (value), which do not support distributed.sequence_parallel "
     "> 1"),
    ("sdar/tracerl_tiny", 2, ["distributed.sequence_parallel=2", "algorithm.value_model=false"], None),
])
def test_a_dry_run_under_torchrun_checks_the_parallel_degrees_against_its_world(recipe, world, overrides, expected,
                                                                                tmp_path, capsys, monkeypatch):
    """The dry run reads the launch from torchrun's environment (``world`` processes) and gives the run's errors for
    the sequence- and expert-parallel degrees: the number of processes, the model's heads and experts."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", "0")
    args = ["train", str(ROOT / "configs" / f"{recipe}.yaml"), *overrides, f"trainer.output_dir={tmp_path / 'run'}",
            "--dry-run"]
    if expected is None:
        assert main(args) == 0, capsys.readouterr().err
    else:
        assert one_line_error(capsys, *args) == expected


def test_a_config_mistake_is_reported_before_the_output_directory_clash(tmp_path, capsys):
    out = tmp_path / "run"
    train(capsys, out)
    other = ["train", SFT, f"trainer.output_dir={out}", *SMALL, "optim.lr=1e-2"]
    assert "trained with other settings" in one_line_error(capsys, *other, "--dry-run")
    for extra in (["--dry-run"], []):
        assert one_line_error(capsys, *other, "algorithm.block_size=8", *extra).startswith(
            "error: algorithm.block_size applies to block-causal families")


def test_a_hub_model_not_in_the_cache_skips_the_family_checks_with_a_note(tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        assert main(["train", SFT, "model.path=dare-test-org/no-such-model", f"trainer.output_dir={tmp_path}/r",
                     "--dry-run"]) == 0
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("note: ")]
    assert notes == ["note: model.path=dare-test-org/no-such-model is a hub name whose config is not in the local "
                     "cache: the dry run skips the checks of algorithm.* against the model family (the run makes "
                     "them once the model is downloaded)"]


@pytest.mark.parametrize("overrides", [[], ["rollout.sampler.sampler=null"]])
def test_an_rl_dry_run_offline_with_an_uncached_hub_model_notes_and_goes_on(tmp_path, overrides):
    """The RL dry run read the hub model's config (``fill_rollout_defaults``) and failed offline; it now says which
    checks it skips, as the SFT one does, and checks the rest (a sampler left unset stays unset)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}  # an empty cache
    (tmp_path / "hf").mkdir()
    proc = subprocess.run([sys.executable, "-m", "dare.cli", "train", str(ROOT / "configs/llada/d1_tiny.yaml"),
                           "model.path=GSAI-ML/LLaDA-8B-Instruct", f"trainer.output_dir={tmp_path / 'run'}",
                           *overrides, "--dry-run"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: ")]
    assert notes == ["note: model.path=GSAI-ML/LLaDA-8B-Instruct is a hub name whose config is not in the local "
                     "cache: the dry run skips the checks of algorithm.* and rollout.sampler against the model family "
                     "(the run makes them once the model is downloaded)"]
    sampler = "null" if overrides else "llada"
    assert f"  sampler:\n    sampler: {sampler}\n" in proc.stdout


def test_the_preflights_tokenizer_error_has_a_name_of_its_own():
    """preflight.tokenizer_error and dare.models.loading.tokenizer_error were two functions of one name and
    different arguments."""
    from dare.trainer import preflight

    assert not hasattr(preflight, "tokenizer_error")
    err = preflight.tokenizer_load_error("model.path", "org/m", OSError("Can't load tokenizer:\nbad file"))
    assert str(err).startswith("model.path=org/m: cannot load a tokenizer (Can't load tokenizer: bad file)")


# ---- B. YAML recipes that would lose settings ---------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("trainer:\n  max_steps: 1\nmodel:\n  path: tiny:llada\ntrainer:\n  max_steps: 2\n",
     "trainer is given twice (lines 1 and 5); keep one"),
    ("optim:\n  lr: 1e-3\n  weight_decay: 0.0\n  lr: 5e-2\n", "optim.lr is given twice (lines 2 and 4); keep one"),
    ("rollout:\n  sampler:\n    steps: 4\n    steps: 8\n", "rollout.sampler.steps is given twice (lines 3 and 4); "
                                                          "keep one"),
])
def test_a_key_given_twice_is_a_one_line_error(tmp_path, capsys, text, expected):
    recipe = tmp_path / "c4.yaml"
    recipe.write_text(text)
    assert one_line_error(capsys, "train", str(recipe), "--dry-run") == f"error: {recipe}: {expected}"
    with pytest.raises(ConfigError, match="given twice"):
        load_yaml(recipe)


def test_merge_keys_may_override_an_anchor(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("base: &b\n  lr: 1\noptim:\n  <<: *b\n  lr: 2\n")
    assert load_yaml(path) == {"base": {"lr": 1}, "optim": {"lr": 2}}


@pytest.mark.parametrize("text", ["", "\n\n", "# a recipe\n# with only comments\n"])
def test_an_empty_recipe_is_an_error(tmp_path, capsys, monkeypatch, text):
    recipe = tmp_path / "c4.yaml"
    recipe.write_text(text)
    monkeypatch.chdir(tmp_path)  # the defaults would train into runs/dare here
    assert one_line_error(capsys, "train", "c4.yaml") == "error: c4.yaml is empty"
    assert not (tmp_path / "runs").exists()


# ---- C. one run per output directory; not into a foreign directory -----------------------------------------------
HOLD = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode()); print('held', flush=True); "
        "time.sleep(120)")
"""Another `dare train` run holding the output directory's lock (what OutputLock.acquire does)."""


def test_a_second_run_on_a_locked_output_dir_fails_with_the_holders_pid(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out / LOCK_FILE)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        expected = (f"error: trainer.output_dir {out} is in use by another `dare train` run (pid {holder.pid}); wait "
                    "for it to end, or use another trainer.output_dir")
        args = ["train", SFT, f"trainer.output_dir={out}", *SMALL]
        assert one_line_error(capsys, *args, "--dry-run") == expected
        assert one_line_error(capsys, *args) == expected
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing written
    finally:
        holder.kill()
        holder.wait()
    train(capsys, out, "trainer.save_every=1")
    check_not_in_use(out)  # released at the end of the run (in this process too)
    assert OutputLock(out).key not in output_dir_module._HELD
    printed = train(capsys, out, "trainer.max_steps=2")  # a later run resumes
    assert f"resumed from {out / 'checkpoints' / 'step_00000001'} at step 1" in printed


def test_the_lock_is_released_when_the_run_fails(tmp_path, capsys, monkeypatch):
    def fail(*args, **kwargs):
        raise ConfigError("no model today")

    monkeypatch.setattr("dare.models.loading.load_model", fail)
    out = tmp_path / "run"
    assert one_line_error(capsys, "train", SFT, f"trainer.output_dir={out}", *SMALL) == "error: no model today"
    monkeypatch.undo()
    check_not_in_use(out)
    assert OutputLock(out).key not in output_dir_module._HELD
    train(capsys, out)


@pytest.mark.parametrize("kind", ["user files", "model checkpoint"])
def test_a_foreign_non_empty_output_dir_is_refused_and_left_alone(tmp_path, capsys, kind):
    out = tmp_path / "out"
    if kind == "user files":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
        holds = "it holds notes.txt"
    else:
        assert main(["tiny", "--family", "llada", "--out", str(out)]) == 0
        capsys.readouterr()
        holds = "it is a `dare tiny` output"
    before = sorted(p.name for p in out.iterdir())
    expected = (f"error: trainer.output_dir {out}: the directory is not empty and is not an earlier `dare train` run "
                f"({holds}); give a new or empty directory (nothing was written)")
    args = ["train", SFT, f"trainer.output_dir={out}", *SMALL]
    assert one_line_error(capsys, *args, "--dry-run") == expected
    assert one_line_error(capsys, *args) == expected
    assert sorted(p.name for p in out.iterdir()) == before


def test_another_ranks_write_probe_does_not_make_the_directory_foreign(tmp_path):
    # rank 1 checks the directory is writable (a probe file made and deleted) while rank 0 lists it: the torchrun flake
    from dare.outputs import PROBE_PREFIX
    from dare.trainer.output_dir import check_output_dir

    out = tmp_path / "run"
    out.mkdir()
    (out / f"{PROBE_PREFIX}abc.tmp").write_text("")
    check_output_dir(out)  # no error: nothing but another process's probe
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"\(it holds notes\.txt\)"):
        check_output_dir(out)


def test_earlier_runs_are_accepted_marked_or_not(tmp_path, capsys):
    out = tmp_path / "run"
    train(capsys, out, "trainer.save_every=1")
    assert json.loads((out / OUTPUT_MARKER).read_text()) == {"written_by": "dare train"}
    (out / OUTPUT_MARKER).unlink()  # a run of an older DARE: recognised by config.yaml + metrics.jsonl, checkpoints/
    (out / LOCK_FILE).unlink()
    assert "resumed from" in train(capsys, out, "trainer.max_steps=2", "trainer.save_every=1")
    empty = tmp_path / "empty"
    empty.mkdir()
    train(capsys, empty)
    marked = tmp_path / "marked"
    mark_output(marked, "train")  # marked, nothing else yet (a run that failed before config.yaml)
    train(capsys, marked)


# ---- D. Ctrl-C says how to resume ---------------------------------------------------------------------------------
def test_an_interrupted_run_names_its_latest_checkpoint_and_the_resume_override(tmp_path, capsys, monkeypatch):
    from dare.trainer.loop import Trainer

    step = Trainer.train_step

    def interrupted_at_3(self, s):
        if s == 2:
            raise KeyboardInterrupt
        return step(self, s)

    monkeypatch.setattr(Trainer, "train_step", interrupted_at_3)
    out = tmp_path / "run"
    args = [f"trainer.output_dir={out}", *SMALL, "trainer.max_steps=4", "trainer.save_every=1"]
    assert main(["train", SFT, *args, "trainer.resume=never"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    checkpoint = out / "checkpoints" / "step_00000002"
    assert err[-2:] == [f"latest checkpoint: {checkpoint} (step 2); to resume from it: dare train {SFT} "
                        f"{' '.join(args)} trainer.resume=auto", "interrupted"]
    monkeypatch.undo()
    assert main(["train", SFT, *args, "trainer.resume=auto"]) == 0  # the lock was released
    assert f"resumed from {checkpoint} at step 2" in capsys.readouterr().out


def test_an_interrupt_before_any_checkpoint_says_a_rerun_starts_over(tmp_path):
    assert interrupt_message(tmp_path) == (f"no checkpoint in {tmp_path} yet (trainer.save_every sets how often one is "
                                           "saved): a rerun starts from step 0")


# ---- E. a warm-up as long as the run is warned ---------------------------------------------------------------------
def warmup_warnings(caplog, tmp_path, *overrides) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        assert main(["train", SFT, f"trainer.output_dir={tmp_path / 'run'}", *overrides, "--dry-run"]) == 0
    return [r.getMessage() for r in caplog.records if "optim.warmup_steps=" in r.getMessage()]


def test_a_warmup_at_least_as_long_as_the_run_is_warned_once(tmp_path, caplog, capsys):
    assert warmup_warnings(caplog, tmp_path, "trainer.max_steps=2", "optim.warmup_steps=100") == [
        "warning: optim.warmup_steps=100 >= the run's 2 steps (trainer.max_steps): the whole run trains in warmup "
        "(the learning rate never reaches optim.lr)"]
    assert warmup_warnings(caplog, tmp_path, "trainer.max_steps=2", "optim.warmup_steps=2") == [
        "warning: optim.warmup_steps=2 >= the run's 2 steps (trainer.max_steps): the whole run trains in warmup "
        "(the learning rate reaches optim.lr only on the last step)"]
    assert warmup_warnings(caplog, tmp_path, "trainer.max_steps=3", "optim.warmup_steps=2") == []
    assert warmup_warnings(caplog, tmp_path, "trainer.max_steps=2", "optim.warmup_steps=0") == []
    assert warmup_warnings(caplog, tmp_path, "trainer.max_steps=null", "optim.warmup_steps=100") == []  # epochs
    capsys.readouterr()


def test_no_shipped_tiny_recipe_warms_up_for_its_whole_run(caplog):
    from dare.trainer.config import load_train_config
    from dare.trainer.preflight import warn_long_warmup

    recipes = sorted((ROOT / "configs").glob("*/*_tiny.yaml"))
    assert recipes
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        for recipe in recipes:
            warn_long_warmup(load_train_config(recipe, []))
    assert [r.getMessage() for r in caplog.records if "optim.warmup_steps=" in r.getMessage()] == []


def test_ranks_given_different_settings_stop_with_one_line_instead_of_training_apart(tmp_path):
    """Before: a per-rank optim.lr trained a silent mixture, a per-rank trainer.max_steps or sequence_parallel hung
    until the process-group timeout (30 minutes)."""
    import subprocess
    import sys

    from torchrun_helpers import worker_env

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "cli_worker.py"), "--rank1", "optim.lr=0.01", "--rank1", "trainer.max_steps=3", "--",
           str(ROOT / "configs/llada/sft_tiny.yaml"), f"trainer.output_dir={tmp_path / 'run'}", "trainer.progress=false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=worker_env(), cwd=ROOT)
    said = ("error: the processes of this torchrun launch have different settings: rank 1 has optim.lr=0.01 where "
            "rank 0 has 0.003 (and 1 more: trainer.max_steps); give every process the same recipe and overrides")
    assert proc.returncode != 0 and proc.stderr.count(said) == 2, proc.stderr[-3000:]  # every rank, at once
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_under_torchrun_warnings_come_once_from_rank_0(tmp_path):
    """Before: every rank printed DARE's warnings (and Python's), one copy per process."""
    import subprocess
    import sys

    from torchrun_helpers import worker_env

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "cli_worker.py"), "--", str(ROOT / "configs/llada/sft_tiny.yaml"),
           f"trainer.output_dir={tmp_path / 'run'}", "trainer.progress=false", "trainer.max_steps=2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=worker_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("warning: optim.warmup_steps=5 >= the run's 2 steps") == 1
    assert proc.stdout.count("done: ") == 1


def test_a_failed_collective_under_torchrun_is_one_line_naming_the_peer(monkeypatch):
    """Before: a rank whose peer had stopped printed a gloo traceback after the peer's own one-line error."""
    from dare.distributed import lost_peer

    gone = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:3499. This is typically caused by ...")
    assert lost_peer(gone) is None  # not under torchrun: DARE's own traceback stays
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert lost_peer(gone) == (
        "rank 0: a collective failed, most likely because another process of this torchrun launch stopped first "
        "(its error is above) (RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:3499. This is "
        "typically caused by ...)")
    assert lost_peer(RuntimeError("shape mismatch")) is None and lost_peer(ValueError("x")) is None
