"""A new user's first hour with ``dare generate`` and ``dare eval run/score``, second round: a checkpoint without a
tokenizer (``--tokenizer``), a training checkpoint given as the model, a results file given as predictions, GSM8K
answers written as numbers, settings of the other evaluation mode, and the small inconsistencies between the
sub-commands (``--dtype auto``, ``--adapter`` without ``--model``, ``--out DIR/``, where results were written, what
``dare tiny`` and ``dare merge-lora`` print)."""

import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import lora_adapter, one_line_error
from rollout_helpers import single_thread  # noqa: F401  (fixture)

from dare.cli import main
from dare.eval import EvalResults, get_benchmark

ROOT = Path(__file__).resolve().parents[1]
TINY_GEN = str(ROOT / "configs/lm_eval/data/tiny_gen.jsonl")
TINY_MC = str(ROOT / "configs/lm_eval/data/tiny_mc.jsonl")
FAST = ["--gen-length", "2", "--shots", "0", "--no-chat", "--no-progress", "--json"]


def gsm8k_run(*extra, model="tiny:llada", data=TINY_GEN):
    return ["eval", "run", *(["--model", str(model)] if model else []), "--benchmark", "gsm8k", "--data", str(data),
            "--limit", "2", *FAST, *map(str, extra)]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def no_weights(monkeypatch):
    """Loading model weights fails the test: the error must come before it."""
    import dare.models.loading

    def never(*args, **kwargs):
        raise AssertionError("loaded the model weights although the command line is wrong")

    monkeypatch.setattr(dare.models.loading, "load_model", never)


@pytest.fixture
def untokenized(tiny_dirs, tmp_path) -> Path:
    """A tiny LLaDA checkpoint saved without its tokenizer files."""
    out = shutil.copytree(tiny_dirs["llada"], tmp_path / "no_tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        (out / name).unlink(missing_ok=True)
    return out


# ------------------------------------------------------------------ 1. a checkpoint without tokenizer files

@pytest.mark.parametrize("command", ["generate", "eval run"])
def test_a_checkpoint_without_tokenizer_files_says_to_pass_tokenizer(command, untokenized, capsys, no_weights):
    """Before: ``error: --model DIR: no usable tokenizer (Couldn't instantiate the backend tokenizer from one of: )``
    (the first line of a several-line transformers message), and no flag to give one."""
    argv = ["generate", "--model", untokenized, "--prompt", "Hi"] if command == "generate" else \
        gsm8k_run(model=untokenized)
    line = one_line_error(capsys, *argv)
    assert line == (f"error: --model {untokenized}: has no tokenizer files (tokenizer_config.json, tokenizer.json, "
                    "...); pass --tokenizer PATH (the directory or hub name of its tokenizer, e.g. the model it was "
                    "trained from)")


@pytest.mark.usefixtures("single_thread")
def test_tokenizer_decodes_a_checkpoint_without_one_in_generate_and_eval(untokenized, tiny_dirs, tmp_path, capsys):
    tokenizer = tiny_dirs["llada"]
    assert main(["generate", "--model", str(untokenized), "--tokenizer", str(tokenizer), "--prompt", "Hi",
                 "--gen-length", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["prompt_tokens"] > 0
    out = tmp_path / "r.json"
    assert main(gsm8k_run("--tokenizer", tokenizer, "--out", out, model=untokenized)) == 0
    assert EvalResults.read(out).model["tokenizer"] == str(tokenizer)


def test_tokenizer_reaches_the_model_loading_of_eval_run_and_sweep(tmp_path, monkeypatch, capsys):
    import dare.eval.run

    seen = []

    def record(*args, **kwargs):
        seen.append(kwargs.get("tokenizer"))
        raise KeyboardInterrupt  # stop here: only the call matters

    monkeypatch.setattr(dare.eval.run, "load_for_eval", record)
    assert main(gsm8k_run("--tokenizer", "tiny:llada")) == 130
    assert main(["eval", "sweep", "--model", "tiny:llada", "--tokenizer", "tiny:llada", "--benchmark", "gsm8k",
                 "--data", TINY_GEN, "--out", str(tmp_path / "sweep"), "--point", "steps=2", "--no-progress"]) == 130
    assert seen == ["tiny:llada", "tiny:llada"]


def test_the_lm_eval_model_takes_a_tokenizer_path_too(untokenized, tiny_dirs):
    pytest.importorskip("lm_eval")
    from dare.eval.lm_harness import DareLM

    lm = DareLM(pretrained=str(untokenized), tokenizer=str(tiny_dirs["llada"]), device="cpu")
    assert lm.tokenizer("Hi")["input_ids"] and lm.model_info["tokenizer"] == str(tiny_dirs["llada"])


@pytest.mark.parametrize("given, message", [
    ("missing", "no such directory"),
    ("data.jsonl", "is a file; expected a tokenizer (or model) directory"),
    ("empty", "has no tokenizer files (tokenizer_config.json, tokenizer.json, ...)"),
])
def test_a_tokenizer_that_is_no_tokenizer_is_one_line(given, message, tmp_path, capsys, no_weights):
    (tmp_path / "empty").mkdir()
    (tmp_path / "data.jsonl").write_text("{}\n")
    line = one_line_error(capsys, "generate", "--model", "tiny:llada", "--tokenizer", tmp_path / given, "--prompt", "x")
    assert line == f"error: --tokenizer {tmp_path / given}: {message}"


def test_a_damaged_tokenizer_is_one_line_with_the_whole_reason(tiny_dirs, tmp_path, capsys):
    damaged = shutil.copytree(tiny_dirs["llada"], tmp_path / "damaged")
    (damaged / "tokenizer.json").write_text("{\n")
    line = one_line_error(capsys, "generate", "--model", damaged, "--prompt", "x")
    assert line.startswith(f"error: --model {damaged}: cannot load its tokenizer (") and "--tokenizer PATH" in line


# ------------------------------------------------------------------ 2. a training checkpoint as the model

def training_run(root: Path, final: str | None) -> Path:
    """A ``dare train`` output directory as the trainer lays it out (a checkpoint at step 2, ``config.yaml``), with
    ``final`` = ``"model"`` (an HF export), ``"adapter"`` (a LoRA export) or None (no export)."""
    from dare.trainer.checkpoint import STATE_FILE, checkpoint_dir

    step = checkpoint_dir(root, 2)
    step.mkdir(parents=True)
    for name in (STATE_FILE, ".metadata", "__0_0.distcp", "rng_rank0.pt"):
        (step / name).write_bytes(b"")
    (root / "config.yaml").write_text("model:\n  path: tiny:llada\n")
    if final == "model":
        (root / "final").mkdir()
        (root / "final" / "config.json").write_text("{}")
    elif final == "adapter":
        (root / "final").mkdir()
        (root / "final" / "adapter_config.json").write_text("{}")
    return root


def test_the_loader_knows_the_trainers_checkpoint_file():
    from dare.models.loading import TRAINER_STATE
    from dare.trainer.checkpoint import STATE_FILE

    assert TRAINER_STATE == STATE_FILE


@pytest.mark.parametrize("command", ["generate", "eval run"])
def test_a_training_checkpoint_as_model_names_the_export_to_load(command, tmp_path, capsys, no_weights):
    """Before: ``error: RUN/checkpoints/step_00000002 is not a model checkpoint (no config.json)``."""
    run = training_run(tmp_path / "run", "model")
    step = run / "checkpoints" / "step_00000002"
    argv = ["generate", "--model", step, "--prompt", "Hi"] if command == "generate" else gsm8k_run(model=step)
    line = one_line_error(capsys, *argv)
    assert line == (f"error: {step} is a training checkpoint (the state `dare train` resumes from), not a model "
                    f"checkpoint; load the run's export instead: {run / 'final'} (the weights at the end of the run); "
                    f"`dare export {step}` writes this checkpoint's weights as a model")
    line = one_line_error(capsys, "generate", "--model", run / "checkpoints", "--prompt", "Hi")
    assert f"{run / 'checkpoints'} holds training checkpoints" in line and f"instead: {run / 'final'}" in line
    assert line.endswith(f"`dare export {run / 'checkpoints' / 'step_N'}` writes the weights of step N as a model")


def test_a_training_checkpoint_of_a_lora_run_names_its_adapter(tmp_path, capsys, no_weights):
    run = training_run(tmp_path / "run", "adapter")
    line = one_line_error(capsys, "generate", "--model", run / "checkpoints" / "step_00000002", "--prompt", "Hi")
    assert line.endswith(f"load the run's export instead: {run / 'final'}, a LoRA adapter (on top of the base model "
                         f"it records: dare eval run --adapter {run / 'final'}); `dare export "
                         f"{run / 'checkpoints' / 'step_00000002'}` writes this checkpoint's weights as a model")
    line = one_line_error(capsys, "generate", "--model", "tiny:llada", "--adapter",
                          run / "checkpoints" / "step_00000002", "--prompt", "Hi")
    assert line.endswith(f"the run's adapter is in {run / 'final'}")


def test_a_training_checkpoint_of_a_run_without_export_says_how_to_write_it(tmp_path, capsys, no_weights):
    run = training_run(tmp_path / "run", None)
    export = f"`dare train {run / 'config.yaml'} trainer.resume=auto trainer.export=true` writes it"
    for model in (run / "checkpoints" / "step_00000002", run):
        line = one_line_error(capsys, "generate", "--model", model, "--prompt", "Hi")
        assert f"the run has no export ({run / 'final'}) yet: {export}" in line, line


# ------------------------------------------------------------------ 3. eval score on a results file or an array

def score(predictions, *extra):
    return ["eval", "score", "--benchmark", "gsm8k", "--predictions", str(predictions), "--json", *map(str, extra)]


def test_a_results_file_as_predictions_says_it_is_already_scored(tmp_path, capsys):
    """Before: ``error: r.json:1: invalid JSON (Expecting property name enclosed in double quotes)``."""
    predictions = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prediction": "27", "answer": "27"},
                                                     {"id": "b", "prediction": "3", "answer": "11"}])
    results = tmp_path / "r.json"
    assert main(score(predictions, "--out", results)) == 0
    capsys.readouterr()
    line = one_line_error(capsys, *score(results))
    assert line == (f"error: {results} is a results file of dare eval run/score, already scored (gsm8k: its "
                    "\"metrics\" field holds accuracy=0.5, reward=0.5); --predictions expects JSON Lines, one "
                    "{\"id\"|\"question\", \"prediction\", \"answer\"} object per line (or a JSON array of them)")


def test_a_json_array_of_predictions_is_scored_and_other_documents_say_what_is_expected(tmp_path, capsys):
    rows = [{"id": "a", "prediction": "27", "answer": 27}, {"id": "b", "prediction": "3", "answer": "11"}]
    array = tmp_path / "p.json"
    array.write_text(json.dumps(rows, indent=1))  # before: "p.json:1: invalid JSON"
    assert main(score(array)) == 0
    assert json.loads(capsys.readouterr().out)["metrics"]["accuracy"] == 0.5
    array.write_text(json.dumps(rows))  # on one line; before: "expected a JSON object, got list"
    assert main(score(array)) == 0
    assert json.loads(capsys.readouterr().out)["num_predictions"] == 2
    array.write_text(json.dumps([rows[0], {"id": "c"}]))
    assert one_line_error(capsys, *score(array)) == f"error: {array}: item 2: missing \"prediction\" (keys: id)"
    pretty = tmp_path / "one.json"
    pretty.write_text(json.dumps(rows[0], indent=1))
    assert one_line_error(capsys, *score(pretty)).startswith(
        f"error: {pretty} holds one JSON object over several lines; --predictions expects JSON Lines")


# ------------------------------------------------------------------ 4. a GSM8K answer written as a number

@pytest.mark.usefixtures("single_thread")
def test_a_numeric_gsm8k_answer_is_a_gold_answer_for_eval_run_and_eval_score(tmp_path, capsys):
    """Before: ``eval run`` refused ``"answer": 42`` with "'answer' must be a string ending in '#### <number>' (or the
    number alone); got 42", while ``eval score`` accepted it."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"question": "What is 40 + 2?", "answer": 42},
                                              {"question": "Half of 5?", "answer": 2.5}])
    out = tmp_path / "r.json"
    assert main(gsm8k_run("--out", out, data=data)) == 0
    assert [s["gold"] for s in EvalResults.read(out).samples] == ["42", "2.5"]
    capsys.readouterr()
    predictions = write_jsonl(tmp_path / "p.jsonl", [{"question": "What is 40 + 2?", "answer": 42,
                                                      "prediction": "The answer is 42."}])
    assert main(score(predictions)) == 0  # native fields: parsed as eval run parses its data
    assert json.loads(capsys.readouterr().out)["metrics"]["accuracy"] == 1.0
    assert main(score(predictions, "--data", data)) == 0
    assert json.loads(capsys.readouterr().out)["metrics"]["accuracy"] == 1.0


@pytest.mark.parametrize("answer, accepted", [
    (42, True), (42.0, True), (-3, True), ("#### 1,000", True), ("7", True),
    (True, False), (None, False), ([42], False), ("no number", False), (float("nan"), False),
])
def test_eval_run_and_eval_score_accept_the_same_gsm8k_answers(answer, accepted):
    from dare.errors import InputError

    bench = get_benchmark("gsm8k")
    outcomes = []
    for parse in (lambda: bench.parse_row({"question": "q", "answer": answer}, 0),  # eval run's data, native lines
                  lambda: bench.from_answer(answer, id="x")):  # eval score's {"id", "answer"} lines
        try:
            outcomes.append(parse().answer)
        except InputError as err:
            assert "'answer' must be a number, or a string ending in '#### <number>' or holding the number alone" \
                   in str(err)
            outcomes.append(None)
    assert outcomes[0] == outcomes[1] and (outcomes[0] is not None) == accepted, outcomes


@pytest.mark.parametrize("key", ["choices", "options"])
def test_a_gsm8k_row_with_choices_is_refused_in_data_and_in_predictions_alike(key, tmp_path, capsys):
    """Before: a generic prediction line ``{"id", "prediction", "answer", "choices"}`` was scored silently, its
    option index taken for the gold number, while the same row in --data (or with native fields) was refused."""
    why = f"it has '{key}' (multiple-choice data: its 'answer' 1 is an option index, not the gold number)"
    row = {"id": 0, "prediction": "A", "answer": 1, key: ["a", "b"]}
    generic = write_jsonl(tmp_path / "p.jsonl", [row])
    assert one_line_error(capsys, *score(generic)) == f"error: {generic}:1: gsm8k: {why}"
    native = write_jsonl(tmp_path / "native.jsonl", [{**row, "question": "q"}])
    assert one_line_error(capsys, *score(native)) == f"error: {native}:1: gsm8k: row 1 is malformed: {why}"
    data = write_jsonl(tmp_path / "d.jsonl", [{"id": 0, "question": "q", "answer": 1, key: ["a", "b"]}])
    assert one_line_error(capsys, *score(generic, "--data", data)) == f"error: gsm8k: row 0 is malformed: {why}"


# ------------------------------------------------------------------ 5. a setting of the other evaluation mode

@pytest.mark.parametrize("argv, message", [
    (gsm8k_run("-o", "mc_samples=4"),
     "error: -o mc_samples applies to likelihood scoring (--mode likelihood, multiple-choice benchmarks); gsm8k is "
     "free-form, so it is evaluated by generation"),
    (["eval", "run", "--model", "tiny:llada", "--benchmark", "mmlu", "--data", TINY_MC, "--mode", "generate",
      "-o", "length_norm=chars"],
     "error: -o length_norm applies to likelihood scoring (--mode likelihood, multiple-choice benchmarks); mmlu is "
     "evaluated by generation here, as --mode generate asks (leave it out to score by likelihood)"),
    (["eval", "run", "--model", "tiny:llada", "--benchmark", "mmlu", "--data", TINY_MC, "-o", "threshold=0.9"],
     "error: -o threshold applies to generation; mmlu is scored by likelihood here (add --mode generate)"),
    (["generate", "--model", "tiny:llada", "--prompt", "Hi", "-o", "mc_samples=4"],
     "error: -o mc_samples is a likelihood-scoring setting of dare eval run (--mode likelihood, multiple-choice "
     "benchmarks); dare generate decodes with a sampler"),
])
def test_a_setting_of_the_other_mode_names_the_mode_it_belongs_to(argv, message, capsys, no_weights):
    """Before: ``unknown sampler option 'mc_samples' (did you mean 'sampler'?)`` and ``unknown likelihood option
    'threshold'``."""
    assert one_line_error(capsys, *argv) == message


def test_a_sweep_refuses_likelihood_settings_in_its_options_and_points(tmp_path, capsys, no_weights):
    sweep = ["eval", "sweep", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", TINY_GEN,
             "--out", tmp_path / "sweep"]
    line = one_line_error(capsys, *sweep, "-o", "mc_samples=2", "--point", "steps=2")
    assert line.startswith("error: -o mc_samples is a likelihood-scoring setting") and "a sweep compares" in line
    line = one_line_error(capsys, *sweep, "--point", "steps=2,length_norm=chars")
    assert line.startswith("error: point 0 (steps=2, length_norm=chars): --point/--grid length_norm is a likelihood")


# ------------------------------------------------------------------ 6. sub-commands that disagreed

def test_dtype_auto_is_accepted_by_generate_as_by_eval(capsys):
    from dare.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    evals = commands["eval"]._subparsers._group_actions[0].choices

    def dtypes(sub):
        return next(a.choices for a in sub._actions if a.dest == "dtype")

    assert dtypes(commands["generate"]) == dtypes(evals["run"]) == dtypes(evals["sweep"])
    assert "auto" in dtypes(commands["generate"])
    assert main(["generate", "--model", "tiny:llada", "--prompt", "Hi", "--dtype", "auto", "--gen-length", "2",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["tokens"]


@pytest.mark.usefixtures("single_thread")
def test_an_adapter_that_records_its_base_model_needs_no_model(tmp_path, capsys):
    adapter = lora_adapter(tmp_path / "adapter", "tiny:llada")
    out = tmp_path / "r.json"
    assert main(gsm8k_run("--adapter", adapter, "--out", out, model=None)) == 0
    assert EvalResults.read(out).model["path"] == "tiny:llada"
    assert f"loading the base model tiny:llada recorded in --adapter {adapter}" in capsys.readouterr().err
    assert main(["generate", "--adapter", str(adapter), "--prompt", "Hi", "--gen-length", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"]


def test_an_adapter_without_a_recorded_base_model_asks_for_model(tmp_path, capsys, no_weights):
    adapter = lora_adapter(tmp_path / "adapter", "")
    line = one_line_error(capsys, *gsm8k_run("--adapter", adapter, model=None))
    assert line == (f"error: --adapter {adapter} records no base model (base_model_name_or_path); pass its base model "
                    "as --model")
    assert one_line_error(capsys, "generate", "--prompt", "Hi") == (
        "error: --model is required (a checkpoint directory, hub name or tiny:FAMILY)")


@pytest.mark.parametrize("command", ["run", "score"])
@pytest.mark.parametrize("existing", [True, False])
def test_out_naming_a_directory_is_refused_with_a_file_name_to_give(command, existing, tmp_path, capsys, no_weights):
    """Before: ``--out results/`` wrote a file named ``results``."""
    target = tmp_path / "results"
    if existing:
        target.mkdir()
    predictions = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prediction": "1", "answer": "1"}])
    argv = gsm8k_run("--out", f"{target}/") if command == "run" else score(predictions, "--out", f"{target}/")
    line = one_line_error(capsys, *argv)
    why = "is a directory" if existing else "ends in '/', so it names a directory"
    assert line == f"error: --out {target}/: {why}; give a file name, e.g. {target / 'gsm8k.json'}"
    assert target.is_dir() == existing  # no file named like the directory


@pytest.mark.usefixtures("single_thread")
def test_eval_run_and_score_say_where_they_wrote(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(gsm8k_run("--out", out)) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["benchmark"] == "gsm8k"  # stdout stays the metrics alone
    assert captured.err.strip().splitlines()[-1] == f"wrote {out}"
    predictions = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prediction": "1", "answer": "1"}])
    scored = tmp_path / "s.json"
    assert main(score(predictions, "--out", scored)) == 0
    assert capsys.readouterr().err.strip().splitlines() == [f"wrote {scored}"]


def test_tiny_and_merge_lora_print_readable_lines(tmp_path, capsys):
    """Before: ``{"family": "llada", "path": ..., "tokenizer": ...}`` and ``{"adapter": ..., "out": ...}``."""
    out = tmp_path / "tiny"
    assert main(["tiny", "--family", "llada", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == (f"wrote {out}: a tiny random llada checkpoint (seed 0, float32) with DARE's byte-level "
                        "tokenizer (264 tokens)")
    assert lines[1] == f"try it: dare generate --model {out} --prompt Hi --gen-length 16"
    adapter = lora_adapter(tmp_path / "adapter", "tiny:llada")
    merged = tmp_path / "merged"
    assert main(["merge-lora", "--adapter", str(adapter), "--out", str(merged)]) == 0
    assert capsys.readouterr().out.strip().splitlines() == [
        f"wrote {merged}: adapter {adapter} merged into tiny:llada (a full checkpoint: load it with --model {merged})"]
