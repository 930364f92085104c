"""What a new user runs into: output paths checked before any work, one-line errors instead of tracebacks,
no silently wrong values, a summary at the end of `dare train`, "interrupted" on a line of its own."""

import json
from pathlib import Path

import pytest
from cli_helpers import one_line_error
import torch

from dare.cli import main
from dare.errors import ConfigError

@pytest.mark.parametrize("command", ["run", "score"])
@pytest.mark.parametrize("flag, value, message", [
    ("--workers", "0", "--workers must be >= 1 (leave it out for one per CPU); got 0"),
    ("--workers", "-2", "--workers must be >= 1 (leave it out for one per CPU); got -2"),
    ("--timeout", "0", "--timeout must be positive (seconds per sandboxed program); got 0.0"),
])
def test_sandbox_options_out_of_range_fail_before_any_work(command, flag, value, message, tmp_path, capsys,
                                                           monkeypatch):
    """Before: the sandbox read --workers 0 as one per CPU and -2 as 1, silently, and refused --timeout 0 only when
    scoring, after the whole generation."""
    import dare.eval.run

    monkeypatch.setattr(dare.eval.run, "load_for_eval",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded the model")))
    head = (["eval", "run", "--model", "tiny:llada"] if command == "run"
            else ["eval", "score", "--predictions", str(tmp_path / "p.jsonl")])
    assert one_line_error(capsys, *head, "--benchmark", "humaneval", f"{flag}={value}") == f"error: {message}"


ROOT = Path(__file__).resolve().parents[1]
GSM8K = [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(3)]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@pytest.fixture
def gsm8k(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in GSM8K))
    return path


@pytest.fixture
def blocked(tmp_path):
    """A path that cannot be created on any machine, even as root: its parent is a regular file."""
    (tmp_path / "file").write_text("")
    return tmp_path / "file" / "sub"


def eval_args(gsm8k, *extra):
    return ["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", str(gsm8k), "--gen-length", "4",
            "--json", *extra]


def test_an_unwritable_eval_output_fails_before_the_evaluation(gsm8k, blocked, capsys, monkeypatch):
    import dare.eval

    def never(*args, **kwargs):
        raise AssertionError("evaluated although --out cannot be written")

    monkeypatch.setattr(dare.eval, "evaluate", never)
    line = one_line_error(capsys, *eval_args(gsm8k, "--out", str(blocked / "results.json")))
    assert "--out" in line and "cannot create" in line


def test_eval_prints_the_metrics_before_writing_them(gsm8k, tmp_path, capsys, monkeypatch):
    from dare.eval.results import EvalResults

    seen = []
    monkeypatch.setattr(EvalResults, "write", lambda self, path: seen.append(capsys.readouterr().out))
    assert main(eval_args(gsm8k, "--out", str(tmp_path / "r.json"), "--limit", "2")) == 0
    assert len(seen) == 1 and json.loads(seen[0])["num_problems"] == 2


@pytest.mark.parametrize("extra, message", [
    (["--k", "5"], "error: pass@5 needs 1 <= k <= num_samples (completions per problem, -n); got num_samples=1"),
    (["-n", "2", "--temperature", "1", "--k", "1", "5"], "error: pass@5 needs 1 <= k <= num_samples"),
])
def test_pass_at_k_beyond_the_samples_fails_before_loading_the_model(extra, message, gsm8k, capsys, monkeypatch):
    import dare.eval.run

    def never(*args, **kwargs):
        raise AssertionError("loaded the model although --k cannot be reported")

    monkeypatch.setattr(dare.eval.run, "load_for_eval", never)
    assert one_line_error(capsys, *eval_args(gsm8k, *extra)).startswith(message)


@pytest.mark.parametrize("command", ["run", "score"])
@pytest.mark.parametrize("extra, message", [
    (["--k", "0"], "argument --k: pass@k takes whole numbers >= 1; got 0"),  # score: a pass@k error naming no flag
    (["--k"], "argument --k: expected at least one argument"),  # before: an empty list, and every pass@k dropped
])
def test_k_takes_whole_numbers_from_one_and_at_least_one(command, extra, message, gsm8k, capsys):
    args = eval_args(gsm8k) if command == "run" else ["eval", "score", "--benchmark", "gsm8k", "--predictions", "x"]
    with pytest.raises(SystemExit) as exit_:
        main([*args, *extra])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"error: dare eval {command}: {message}")


def test_pass_at_k_asked_for_is_reported_never_dropped(gsm8k, tmp_path, capsys):
    assert main(eval_args(gsm8k, "--limit", "2", "--k", "1")) == 0
    assert "pass@1" in json.loads(capsys.readouterr().out)["metrics"]
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"id": 0, "prediction": "#### 1", "answer": "#### 1"}) + "\n")
    line = one_line_error(capsys, "eval", "score", "--benchmark", "gsm8k", "--predictions", str(preds), "--k", "5")
    assert line == "error: gsm8k: pass@5 needs at least 5 predictions per problem (fewest: 1)"


def test_eval_limit_must_be_positive(gsm8k, capsys):
    assert "--limit must be positive" in one_line_error(capsys, *eval_args(gsm8k, "--limit", "-1"))


@pytest.mark.parametrize("command", [
    ["tiny", "--family", "llada", "--out", "{}"],
    ["demo", "--quick", "--out", "{}"],
    ["train", str(ROOT / "configs/llada/sft_tiny.yaml"), "trainer.output_dir={}"],
    ["merge-lora", "--adapter", "no_adapter_needed_yet", "--out", "{}/merged"],
])
def test_an_output_directory_that_cannot_be_created_is_one_line(command, blocked, capsys):
    line = one_line_error(capsys, *[part.replace("{}", str(blocked)) for part in command])
    assert str(blocked) in line and "cannot create the directory" in line


@NO_CUDA
@pytest.mark.parametrize("command", [
    ["generate", "--model", "tiny:llada", "--prompt", "Hi"],
    ["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k"],
    ["demo", "--quick"],
])
def test_cuda_without_cuda_is_one_line_and_writes_nothing(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    extra = ["--out", str(tmp_path / "demo")] if command[0] == "demo" else []
    line = one_line_error(capsys, *command, *extra, "--device", "cuda")
    assert "CUDA is not available" in line
    assert not (tmp_path / "demo").exists()


def test_checkpoint_directories_without_a_model_are_one_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    config_only = tmp_path / "config_only"
    config_only.mkdir()
    (config_only / "config.json").write_text("{}")
    assert "no config.json" in one_line_error(capsys, "generate", "--model", str(empty), "--prompt", "Hi")
    assert "no weights" in one_line_error(capsys, "generate", "--model", str(config_only), "--prompt", "Hi")
    line = one_line_error(capsys, "train", f"model.path={config_only}", f"trainer.output_dir={tmp_path / 'run'}")
    assert "no weights" in line


def test_an_adapter_or_a_run_directory_as_model_says_what_to_pass_instead(tmp_path, capsys):
    adapter = tmp_path / "run" / "final"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    line = one_line_error(capsys, "generate", "--model", str(adapter), "--prompt", "Hi")
    assert line.startswith(f"error: {adapter} is not a model checkpoint (no config.json); it is a LoRA adapter")
    assert f"dare merge-lora --adapter {adapter} --out DIR" in line
    line = one_line_error(capsys, "generate", "--model", str(tmp_path / "run"), "--prompt", "Hi")
    assert line.endswith(f"it looks like a training run directory: its weights are in {adapter}")


def test_a_missing_relative_model_path_says_the_directory_does_not_exist(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, "generate", "--model", "runs/nope/final", "--prompt", "Hi")
    assert line.endswith("runs/nope/final: no such checkpoint directory")


def test_a_mis_shaped_tensor_is_a_config_error(tmp_path):
    from safetensors.torch import load_file, save_file

    from dare.models.loading import load_model
    from dare.models.tiny import write_tiny_checkpoint

    path = write_tiny_checkpoint("llada", tmp_path / "ckpt", seed=0)
    weights = load_file(path / "model.safetensors")
    name = next(k for k in weights if k.endswith("q_proj.weight"))
    weights[name] = weights[name][:-1].contiguous()
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=rf"mismatched keys: {name} \(checkpoint \[63, 64\] vs model \[64, 64\]\)"):
        load_model(str(path))


def test_train_without_a_recipe_shows_the_usage(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train"]) == 2
    assert "usage: dare train" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_an_empty_data_file_says_so(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    line = one_line_error(capsys, "train", f"data.path={empty}", f"trainer.output_dir={tmp_path / 'run'}",
                          "trainer.progress=false")
    assert line == f"error: data file {empty} holds no records"


def test_train_ends_with_a_summary(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", str(ROOT / "configs/llada/sft_tiny.yaml"), f"trainer.output_dir={out}",
                 "trainer.max_steps=2", "trainer.progress=false", "data.num_examples=16", "trainer.batch_size=4",
                 "trainer.micro_batch_size=4"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()[-2:]
    assert lines[0].startswith(f"done: {out} (step 2, ") and " loss " in lines[0]
    assert lines[1] == f"final weights (HF checkpoint): {out / 'final'}"


def test_the_summary_notes_a_rollout_that_fell_back_to_the_eager_loop(tmp_path):
    from dare.commands.train import run_summary
    from dare.trainer import load_train_config

    config = load_train_config(str(ROOT / "configs/llada/d1_tiny.yaml"), [f"trainer.output_dir={tmp_path}"])
    record = {"step": 3, "loss": 0.1, "rollout/reward": 0.5, "rollout/engine_fallbacks": 0.0}
    assert "eager loop" not in run_summary(config, record)
    record["rollout/engine_fallbacks"] = 2.0
    last = run_summary(config, record).splitlines()[-1]
    assert last.startswith("note: the last step's rollout decoded 2 generation call(s) with the slow eager loop")


def test_interrupted_gets_a_line_of_its_own_after_a_progress_bar(capsys, monkeypatch):
    import sys

    from tqdm import tqdm

    import dare.commands.tiny as command

    def run(args):
        bar = tqdm(total=10, desc="train", file=sys.stderr)
        bar.update(3)
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "run", run)
    assert main(["tiny", "--family", "llada", "--out", "x"]) == 130
    err = capsys.readouterr().err
    assert err.endswith("\ninterrupted\n") and "train" in err


def test_an_error_is_quoted_by_its_first_line_or_its_type():
    from dare.errors import first_line

    assert first_line(OSError("  cannot open x\nTraceback detail")) == "cannot open x"
    assert first_line(ValueError("")) == "ValueError" and first_line(RuntimeError("  \n ")) == "RuntimeError"


def test_an_unreadable_checkpoint_with_an_empty_message_is_still_one_line(monkeypatch):
    import dare.models.loading as loading
    from dare.errors import InputError
    from dare.eval.run import load_for_eval

    def fails(*args, **kwargs):
        raise OSError()

    monkeypatch.setattr(loading, "load_model", fails)
    with pytest.raises(InputError, match="cannot load model some/dir: OSError"):
        load_for_eval("some/dir", None, "cpu", None)


def test_merging_an_adapter_into_a_model_of_another_family_is_one_line(tmp_path, capsys):
    from peft import LoraConfig, get_peft_model

    from dare.models.spec import family_of
    from dare.models.tiny import tiny_model

    model = tiny_model("llada", seed=0)
    adapter = tmp_path / "adapter"
    get_peft_model(model, LoraConfig(r=2, target_modules=family_of(model).lora_targets)).save_pretrained(str(adapter))
    line = one_line_error(capsys, "merge-lora", "--adapter", str(adapter), "--base", "tiny:sdar",
                          "--out", str(tmp_path / "merged"))
    assert line.startswith(f"error: cannot load tiny model tiny:sdar with adapter {adapter}: ")
    assert "not found in the base model" in line and not (tmp_path / "merged").exists()


def test_a_choice_answer_that_is_no_option_names_its_line(tmp_path, capsys):
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"id": "a", "prediction": "B", "answer": "B"}) + "\n"
                     + json.dumps({"id": "b", "prediction": "B", "answer": "27"}) + "\n")
    line = one_line_error(capsys, "eval", "score", "--benchmark", "mmlu", "--predictions", str(preds))
    assert line == f"error: {preds}:2: mmlu: 'answer' must be an option index 0-9 or a letter A-J; got '27'"


def test_rows_of_another_benchmark_say_what_the_benchmark_expects(gsm8k, tmp_path, capsys):
    line = one_line_error(capsys, "eval", "run", "--model", "tiny:llada", "--benchmark", "mmlu", "--data", str(gsm8k))
    assert line == "error: mmlu: row 0 lacks column 'choices' (has: answer, question)"
    mmlu = tmp_path / "mmlu.jsonl"
    mmlu.write_text(json.dumps({"question": "1 + 1?", "choices": ["1", "2", "3", "4"], "answer": "2 of course"}) + "\n")
    line = one_line_error(capsys, "eval", "run", "--model", "tiny:llada", "--benchmark", "mmlu", "--data", str(mmlu))
    assert line == "error: mmlu: row 0 is malformed: 'answer' must be an option index 0-3 or a letter A-D; got '2 of course'"


@pytest.mark.parametrize("label", ["", "4", -1, "B"])
def test_a_hellaswag_label_that_is_no_ending_index_says_what_it_must_be(label, tmp_path, capsys):
    """Before: Python's "invalid literal for int() with base 10: ''" (or an IndexError for an index past the end)."""
    rows = tmp_path / "hellaswag.jsonl"
    rows.write_text(json.dumps({"ctx": "A man walks", "endings": ["a", "b", "c", "d"], "label": label}) + "\n")
    line = one_line_error(capsys, "eval", "run", "--model", "tiny:llada", "--benchmark", "hellaswag", "--data", rows,
                          "--shots", "0")
    assert line == f"error: hellaswag: row 0 is malformed: 'label' must be an ending index 0-3; got {label!r}"


def test_gsm8k_rows_need_a_numeric_final_answer(tmp_path, capsys):
    mmlu = tmp_path / "mmlu.jsonl"
    mmlu.write_text(json.dumps({"question": "1 + 1?", "choices": ["1", "2", "3", "4"], "answer": 1}) + "\n")
    line = one_line_error(capsys, *eval_args(mmlu))  # gsm8k scored the option index 1 as the gold number
    assert line == ("error: gsm8k: row 0 is malformed: it has 'choices' (multiple-choice data: its 'answer' 1 is an "
                    "option index, not the gold number)")
    from dare.eval import get_benchmark

    shipped = ROOT / "configs/lm_eval/data/tiny_gen.jsonl"  # the shipped gsm8k-format fixture still loads
    assert [s.answer for s in get_benchmark("gsm8k").load(str(shipped), limit=2)] == ["27", "11"]


def test_a_sweep_output_that_is_a_file_fails_before_the_first_point(gsm8k, tmp_path, capsys, monkeypatch):
    import dare.eval

    def never(*args, **kwargs):
        raise AssertionError("evaluated although --out cannot be written")

    monkeypatch.setattr(dare.eval, "evaluate", never)
    (tmp_path / "taken").write_text("")
    line = one_line_error(capsys, "eval", "sweep", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data",
                          str(gsm8k), "--gen-length", "4", "--out", str(tmp_path / "taken"), "--point", "sampler=llada")
    assert line == f"error: --out {tmp_path / 'taken'}: exists and is not a directory"


def help_text(capsys, *command) -> str:
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_the_gen_length_help_states_each_commands_real_default(capsys):
    from dare.rollout.config import DEFAULT_GEN_LENGTH

    assert f"--gen-length GEN_LENGTH generated tokens (default {DEFAULT_GEN_LENGTH})" in help_text(
        capsys, "generate")
    for command in (["eval", "run"], ["eval", "sweep"]):
        text = help_text(capsys, *command)
        assert "(default: the benchmark's max_new_tokens" in text and "default 128" not in text, command


def test_every_command_has_a_description_and_every_option_a_help_text():
    import argparse

    from dare.cli import build_parser

    missing = []

    def walk(parser, name):
        if not parser.description:
            missing.append(name)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    walk(subparser, f"{name} {sub}")
            elif action.option_strings and not action.help:
                missing.append(f"{name} {action.option_strings[-1]}")

    walk(build_parser(), "dare")
    assert missing == []


def test_the_pass_at_k_warning_is_one_clean_line(gsm8k):
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "dare.cli", *eval_args(gsm8k, "-n", "2", "--limit", "1", "--no-progress")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stderr.splitlines() if "finish=length" not in line] == [
        "warning: 2 samples per problem with temperature 0 are identical; pass@k needs temperature > 0"]


def split_dir(tmp_path, layout: dict[str, list[dict]]):
    root = tmp_path / "data"
    for name, rows in layout.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_a_split_picks_the_files_of_a_directory_that_name_it(tmp_path):
    from dare.eval import get_benchmark

    train = [{"question": "Q train", "answer": "#### 1"}]
    root = split_dir(tmp_path, {"main/train-00000-of-00001.jsonl": train, "main/test-00000-of-00001.jsonl": GSM8K})
    bench = get_benchmark("gsm8k")
    assert [s.question for s in bench.load(str(root), split="test")] == [r["question"] for r in GSM8K]
    assert [s.question for s in bench.load(str(root), split="train")] == ["Q train"]
    one = split_dir(tmp_path / "one", {"test.jsonl": GSM8K, "extra.jsonl": train})  # one split named: all files
    assert len(bench.load(str(one))) == 4


@pytest.mark.parametrize("case, message", [
    ("mixed", "gsm8k: {root} holds files of several splits (test, train): choose one (--split, or the split's file "
              "itself)"),
    ("absent", "gsm8k: no file of split 'validation' under {root} (a file's path must name it, e.g. validation.jsonl "
               "or validation/...)"),
    ("typo", "gsm8k: no file of split 'tset' under {root} (did you mean 'test'? a file's path must name it, e.g. "
             "tset.jsonl or tset/...)"),
    ("file", "gsm8k: a split applies to a HF dataset or a directory of split files; {file} is one file (drop the "
             "split)"),
])
def test_a_split_is_never_ignored_or_mixed_silently(case, message, tmp_path, gsm8k, capsys, monkeypatch):
    """Before: a directory's train and test files were concatenated into one evaluation, and --split with a local
    file was dropped."""
    import dare.eval.run

    monkeypatch.setattr(dare.eval.run, "load_for_eval",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded the model")))
    root = split_dir(tmp_path, {"train.jsonl": GSM8K, "test.jsonl": GSM8K})
    data, extra = {"mixed": (root, ()), "absent": (root, ("--split", "validation")), "typo": (root, ("--split", "tset")),
                   "file": (gsm8k, ("--split", "test"))}[case]
    args = ["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", str(data), *extra]
    assert one_line_error(capsys, *args) == "error: " + message.format(root=root, file=gsm8k)


@pytest.mark.parametrize("command", ["run", "score"])
def test_sandbox_options_on_a_benchmark_without_tests_are_one_line_errors(command, gsm8k, tmp_path, capsys,
                                                                           monkeypatch):
    import dare.eval.run

    monkeypatch.setattr(dare.eval.run, "load_for_eval",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded the model")))
    predictions = tmp_path / "p.jsonl"
    predictions.write_text(json.dumps({"id": "0", "prediction": "2", "answer": "2"}) + "\n")
    head = (["eval", "run", "--model", "tiny:llada", "--data", str(gsm8k)] if command == "run"
            else ["eval", "score", "--predictions", str(predictions)])
    for flag, value in (("--workers", "4"), ("--timeout", "3")):
        assert one_line_error(capsys, *head, "--benchmark", "gsm8k", flag, value) == (
            f"error: {flag} applies to code benchmarks (their tests run in the sandbox); gsm8k is scored from its "
            "answers")
    if command == "score":
        assert one_line_error(capsys, *head, "--benchmark", "gsm8k", "--trust-prediction-tests") == (
            "error: --trust-prediction-tests applies to code benchmarks; gsm8k is scored from its answers")
        assert one_line_error(capsys, *head, "--benchmark", "gsm8k", "--split", "test") == (
            "error: --split picks the split of --data; without --data the predictions file is scored as it is")


@pytest.mark.parametrize("argv, message", [
    (["trian"], "error: dare: argument COMMAND: invalid choice: 'trian' (choose from 'demo', 'eval', 'generate', "
                "'tiny', 'train', 'recipes', 'runs', 'merge-lora', 'export') (did you mean 'train'?); see 'dare --help'"),
    (["--versoin"], "error: dare: unrecognized arguments: --versoin (did you mean '--version'?); see 'dare --help'"),
    (["eval", "rnu"], "error: dare eval: argument SUBCOMMAND: invalid choice: 'rnu' (choose from 'run', 'sweep', "
                      "'lm-eval', 'opencompass', 'score') (did you mean 'run'?); see 'dare eval --help'"),
    (["generate", "--model", "tiny:llada", "--prompt", "x", "--gen-lenght", "8"],
     "error: dare generate: unrecognized arguments: --gen-lenght 8 (did you mean '--gen-length'?); see 'dare generate "
     "--help'"),
    (["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--tempertaure=0.5"],
     "error: dare eval run: unrecognized arguments: --tempertaure=0.5 (did you mean '--temperature'?); see 'dare eval "
     "run --help'"),
    (["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--mode", "generat"],
     "error: dare eval run: argument --mode: invalid choice: 'generat' (choose from 'auto', 'generate', 'likelihood') "
     "(did you mean 'generate'?); see 'dare eval run --help'"),
    (["generate", "--model", "tiny:llada"],
     "error: dare generate: the following arguments are required: --prompt; see 'dare generate --help'"),
])
def test_command_line_typos_are_one_line_errors_naming_the_closest_option(argv, message, capsys):
    """Before: argparse printed the top-level usage block and 'unrecognized arguments' without the sub-command, and
    `dare --versoin` printed the help and exited as if nothing was wrong."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]


@pytest.mark.parametrize("argv, message", [
    (["generate", "--model", "tiny:llada", "--prompt", "x", "--temperature", "0.5", "--temperature", "0.9"],
     "error: dare generate: argument --temperature: given twice (0.5, 0.9); give it once; see 'dare generate --help'"),
    (["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "-n", "2", "--num-samples", "4"],
     "error: dare eval run: argument --num-samples/-n: given twice (2, 4); give it once; see 'dare eval run --help'"),
    (["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--k", "1", "5", "--k", "10"],
     "error: dare eval run: argument --k: given twice (1 5, 10); give it once; see 'dare eval run --help'"),
    (["tiny", "--family", "llada", "--out", "a", "--out", "b"],
     "error: dare tiny: argument --out: given twice (a, b); give it once; see 'dare tiny --help'"),
])
def test_a_single_valued_option_given_twice_with_other_values_is_a_one_line_error(argv, message, capsys, tmp_path,
                                                                                  monkeypatch):
    """Before: argparse kept the last value (`--temperature 0.5 --temperature 0.9` decoded at 0.9, silently)."""
    monkeypatch.chdir(tmp_path)  # without the check, `dare tiny --out b` would write there
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]


def test_repeatable_options_repeated_flags_and_a_repeated_same_value_still_parse(capsys):
    from dare.cli import build_parser

    parse = build_parser().parse_known_args
    args, extra = parse(["generate", "--model", "m", "--prompt", "a", "--prompt", "b", "-o", "cache=dual", "-o",
                         "top_k=3", "--json", "--json", "--temperature", "0.5", "--temperature", "0.50"])
    assert (args.prompt, args.option, args.json, args.temperature, extra) == (
        ["a", "b"], ["cache=dual", "top_k=3"], True, 0.5, [])
    args, _ = parse(["eval", "sweep", "--model", "m", "--benchmark", "gsm8k", "--out", "o", "--grid",
                     "steps=8,4", "--grid", "threshold=0.5,0.9", "--point", "steps=2", "--point", "steps=1"])
    assert args.grid == ["steps=8,4", "threshold=0.5,0.9"] and args.point == ["steps=2", "steps=1"]
    assert not hasattr(args, "_given")  # the parser's bookkeeping stays out of the namespace
    args, extra = parse(["train", "a.yaml", "--dry-run", "--dry-run", "x=1"])  # positionals are not options
    assert (args.config, args.dry_run, extra) == ("a.yaml", True, ["x=1"])
    with pytest.raises(SystemExit):
        parse(["eval", "sweep", "--model", "m", "--benchmark", "gsm8k", "--out", "o", "--out", "p"])
    assert "argument --out: given twice (o, p)" in capsys.readouterr().err


def test_every_sub_command_parser_refuses_a_repeated_option():
    """Every (sub-)parser is a dare.cli.Parser, so each single-valued option is stored once."""
    import argparse

    from dare.cli import Parser, StoreOnce, build_parser

    def parsers(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from parsers(sub)

    found = list(parsers(build_parser()))
    assert len(found) > 8 and all(isinstance(p, Parser) for p in found)
    stores = [a for p in found for a in p._actions if isinstance(a, argparse._StoreAction)]
    assert stores and all(isinstance(a, StoreOnce) for a in stores)


@pytest.mark.parametrize("switch,value", [("DARE_FUSE_CACHE_WRITES", "yes"), ("DARE_DECODE_ATTENTION", "flash"),
                                          ("DARE_FUSE_MAX_ROWS", "many"), ("DARE_COMPILE_SAMPLING", "on")])
def test_a_misspelt_kernel_switch_fails_every_command_before_its_work(switch, value, capsys, monkeypatch):
    import dare.commands.generate

    monkeypatch.setattr(dare.commands.generate, "run", lambda args: pytest.fail("ran with a misspelt switch"))
    monkeypatch.setenv("DARE_FUSE_PROJECTIONS", "0")  # DARE_FUSE_MAX_ROWS is checked even when fusion is off
    monkeypatch.setenv(switch, value)
    line = one_line_error(capsys, "generate", "--model", "tiny:llada", "--prompt", "hi")
    assert switch in line and repr(value) in line


def test_an_unknown_dare_variable_is_named_with_the_closest_setting(capsys, monkeypatch):
    import dare.commands.generate

    monkeypatch.setattr(dare.commands.generate, "run", lambda args: 0)
    monkeypatch.setenv("DARE_FUSE_CACHE_WRITE", "0")
    monkeypatch.setenv("DARE_XYZZY", "1")
    assert main(["generate", "--model", "tiny:llada", "--prompt", "hi"]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == ("warning: DARE_FUSE_CACHE_WRITE is not a DARE setting and is ignored "
                        "(did you mean DARE_FUSE_CACHE_WRITES?)")
    assert lines[1].startswith("warning: DARE_XYZZY is not a DARE setting and is ignored; DARE reads ")
    assert len(lines) == 2
    assert main(["recipes", "llada"]) == 0  # the light command (no torch) says so too
    assert capsys.readouterr().err.strip().splitlines() == lines


def test_every_dare_variable_the_code_reads_is_a_known_setting():
    import re

    from dare.config import ENVIRONMENT

    sources = [*ROOT.joinpath("src").rglob("*.py"), ROOT / ".ci" / "run"]
    read = {name for path in sources for name in re.findall(r"\bDARE_[A-Z0-9_]+", path.read_text())}
    assert read and read == set(ENVIRONMENT)


def test_every_numeric_option_of_every_sub_command_takes_a_negative_number_in_any_notation():
    """Before: Python 3.11's argparse read `--rl-lr -1e-3` as two options (`argument --rl-lr: expected one argument`);
    a negative value is a value now, left to the command's own range check."""
    import argparse

    from dare.cli import build_parser

    def numeric_options(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from numeric_options(sub, [*path, name])
            elif action.option_strings and action.type in (int, float):
                required = [word for other in parser._actions if other.required and other.option_strings
                            for word in (other.option_strings[0], "x")]
                yield path + required, action

    found = list(numeric_options(build_parser(), []))
    assert {("demo", "--rl-lr"), ("generate", "--temperature"), ("eval", "--timeout")} <= {
        (path[0], action.option_strings[0]) for path, action in found}
    for path, action in found:
        written, expected = ("-1e-3", -0.001) if action.type is float else ("-3", -3)
        args, extra = build_parser().parse_known_args([*path, action.option_strings[0], written])
        value = getattr(args, action.dest)
        assert (value[0] if action.nargs == "*" else value, extra) == (expected, []), (path, action.option_strings)
    args, _ = build_parser().parse_known_args(["demo", "--sft-target", "-2.5E+1", "--rl-lr", "-.5e-2"])
    assert (args.sft_target, args.rl_lr) == (-25.0, -0.005)


@pytest.mark.parametrize("argv, message", [
    (["generate", "--model", "tiny:llada", "--prompt", "-hi"],
     "error: dare generate: argument --prompt: expected one argument (-hi reads as an option: write --prompt=-hi); "
     "see 'dare generate --help'"),
    (["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "-n", "-inf"],
     "error: dare eval run: argument --num-samples/-n: expected one argument (-inf reads as an option: write "
     "--num-samples=-inf); see 'dare eval run --help'"),
])
def test_a_value_read_as_an_option_says_to_write_flag_equals_value(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]


def test_a_negative_value_reaches_the_commands_own_check(capsys):
    assert main(["generate", "--model", "tiny:llada", "--prompt", "x", "--temperature", "-1e-3"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: temperature must be >= 0; got -0.001"]


def test_a_checkpoint_path_missing_by_its_step_number_or_a_typo_names_the_directory_there(tmp_path, capsys):
    """The README writes RUN/checkpoints/step_N; the directories are zero-padded (step_00000040)."""
    (tmp_path / "run" / "checkpoints" / "step_00000040").mkdir(parents=True)
    (tmp_path / "run" / "final").mkdir()
    for given, meant in (("checkpoints/step_40", "checkpoints/step_00000040"), ("fnal", "final")):
        line = one_line_error(capsys, "generate", "--model", tmp_path / "run" / given, "--prompt", "hi")
        assert line == (f"error: model path {tmp_path / 'run' / given}: no such checkpoint directory (did you mean "
                        f"{tmp_path / 'run' / meant}?)")


TORCH_OOM = ("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.23 "
             "GiB is free. Including non-PyTorch memory, this process has 77.95 GiB memory in use. Of the allocated "
             "memory 75.10 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated. If "
             "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
             "to avoid fragmentation.  See documentation for Memory Management  "
             "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


@pytest.mark.parametrize("command,args,hint", [
    ("train", ["configs/llada/d1_tiny.yaml"], "trainer.micro_batch_size"),
    ("generate", ["--model", "tiny:llada", "--prompt", "hi"], "--gen-length"),
    ("eval", ["run", "--benchmark", "gsm8k", "--model", "tiny:llada"], "--batch-size (default 8)"),
])
def test_running_out_of_device_memory_is_one_line_naming_what_to_lower(command, args, hint, capsys, monkeypatch):
    """A batch that does not fit the GPU ends in one line: torch's figures and the command's settings to lower,
    not a stack trace."""
    import importlib

    from dare.cli import COMMANDS

    def out_of_memory(args):
        try:
            raise torch.OutOfMemoryError(TORCH_OOM)
        except torch.OutOfMemoryError as err:  # e.g. torch.compile re-raises it as its own error
            raise RuntimeError("backend compiler failed") from err

    monkeypatch.setattr(importlib.import_module(COMMANDS[command]), "run", out_of_memory)
    line = one_line_error(capsys, command, *args)
    assert line.startswith("error: out of device memory (Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
                           "79.19 GiB of which 1.23 GiB is free); to fit, lower ")
    assert hint in line and "expandable_segments:True" in line and line.endswith("(DARE_TRACEBACK=1 shows where)")


def test_other_errors_of_dare_itself_keep_their_traceback(monkeypatch):
    import importlib

    from dare.cli import COMMANDS

    def bug(args):
        raise RuntimeError("an index out of range in DARE's own code")

    monkeypatch.setattr(importlib.import_module(COMMANDS["generate"]), "run", bug)
    with pytest.raises(RuntimeError, match="DARE's own code"):
        main(["generate", "--model", "tiny:llada", "--prompt", "hi"])


def test_out_of_memory_reads_the_error_raised_or_the_one_behind_it():
    from dare.devices import out_of_memory

    assert out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 MiB")) == (
        "out of device memory (Tried to allocate 1.00 MiB) (DARE_TRACEBACK=1 shows where)")
    assert out_of_memory(ValueError("bad")) is None
    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first  # a cycle of contexts ends, unanswered
    assert out_of_memory(first) is None
