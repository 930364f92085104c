"""What a new user meets in their first hour of ``dare eval``: few-shot exemplars from the evaluated data are
announced and recorded, settings given twice are one-line errors, unused or unusable inputs are reported, and error
messages say what to do."""

import json
import logging
from pathlib import Path

import pytest
from test_cli_errors import one_line_error  # noqa: F401

from dare.cli import main
from dare.eval import EvalResults, get_benchmark

ROOT = Path(__file__).resolve().parents[1]
TINY_GEN = str(ROOT / "configs/lm_eval/data/tiny_gen.jsonl")
TINY_MC = str(ROOT / "configs/lm_eval/data/tiny_mc.jsonl")



def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("dare.eval") and r.levelno >= logging.WARNING]


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: the error must come before it."""
    import dare.commands.generate
    import dare.eval.run

    def never(*args, **kwargs):
        raise AssertionError("loaded the model although the command line is wrong")

    monkeypatch.setattr(dare.eval.run, "load_for_eval", never)
    monkeypatch.setattr(dare.commands.generate, "load_model", never)


def mmlu_run(*extra):
    return ["eval", "run", "--model", "tiny:llada", "--benchmark", "mmlu", "--data", TINY_MC, "--limit", "3",
            "--mc-samples", "1", "--json", *extra]


def gsm8k_run(data=TINY_GEN, *extra):
    return ["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", str(data), "--limit", "2",
            "--gen-length", "2", "--json", *extra]


# ------------------------------------------------------------------ 1. few-shot pool = evaluated data

def test_exemplars_from_the_evaluated_data_warn_once_and_are_recorded(tmp_path, caplog, capsys):
    out = tmp_path / "r.json"
    with caplog.at_level(logging.WARNING, logger="dare"):
        assert main(mmlu_run("--out", str(out))) == 0
    [warning] = warnings_of(caplog)
    assert warning.startswith("warning: the 5-shot exemplars (mmlu's default) come from the evaluated data")
    assert "--fewshot-data" in warning and "--shots 0" in warning
    results = EvalResults.read(out)
    assert results.prompt["fewshot_source"] == "evaluated data" and results.prompt["shots"] == 5


def test_exemplars_from_a_separate_file_do_not_warn_and_record_the_file(tmp_path, caplog, capsys):
    rows = [json.loads(line) for line in Path(TINY_MC).read_text().splitlines()]
    pool = write_jsonl(tmp_path / "dev.jsonl", [{**r, "question": "Dev " + r["question"]} for r in rows])
    out = tmp_path / "r.json"
    with caplog.at_level(logging.WARNING, logger="dare"):
        assert main(mmlu_run("--fewshot-data", str(pool), "--shots", "2", "--out", str(out))) == 0
    assert warnings_of(caplog) == []
    assert EvalResults.read(out).prompt["fewshot_source"] == str(pool)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dare"):  # the evaluated file again, as --fewshot-data
        assert main(mmlu_run("--fewshot-data", TINY_MC, "--shots", "2")) == 0
    [warning] = warnings_of(caplog)
    assert warning.startswith(f"warning: 3 of the 8 few-shot problems ({TINY_MC}) are also evaluated")


def test_the_python_api_warns_and_records_exemplars_from_the_evaluated_samples(caplog):
    from dare.eval import EvalConfig, LikelihoodConfig, evaluate
    from dare.eval.run import load_for_eval

    model, tokenizer, _ = load_for_eval("tiny:llada", None, "cpu", None)
    bench = get_benchmark("mmlu")
    samples = bench.load(TINY_MC, limit=3)
    with caplog.at_level(logging.WARNING, logger="dare"):
        results = evaluate(model, tokenizer, bench, samples, likelihood=LikelihoodConfig(mc_samples=1),
                           config=EvalConfig(shots=1))
        assert len(warnings_of(caplog)) == 1 and results.prompt["fewshot_source"] == "evaluated data"
        results = evaluate(model, tokenizer, bench, samples, likelihood=LikelihoodConfig(mc_samples=1),
                           config=EvalConfig(shots=1), fewshot_pool=bench.load(TINY_MC), fewshot_source="dev")
    assert len(warnings_of(caplog)) == 1 and results.prompt["fewshot_source"] == "dev"


def test_a_problem_is_never_its_own_exemplar_not_even_as_a_duplicate_row():
    from dare.eval.run import _shots

    bench = get_benchmark("mmlu")
    rows = [{"question": f"What is {i} + 1?", "choices": ["1", "2", str(i + 1), "9"], "answer": 2} for i in range(4)]
    samples = [bench.parse_row(row, i) for i, row in enumerate(rows + rows[:1])]  # row 4 repeats row 0 (own id)
    assert samples[4].id != samples[0].id
    for seed in range(10):
        exemplars = _shots(bench, samples[0], samples, 2, seed)
        assert samples[0].question not in [s.question for s in exemplars], seed


def test_a_fewshot_file_as_long_as_the_shots_is_usable(tmp_path, capsys):
    """Rows without ids of two files share ids (gsm8k/0, ...) without being the same problem: no exemplar of the
    few-shot file may be dropped for the evaluated problem of the same index."""
    pool = write_jsonl(tmp_path / "shots.jsonl", [{"question": f"Q{i}?", "answer": f"{i} #### {i}"} for i in range(2)])
    out = tmp_path / "r.json"
    assert main(gsm8k_run(TINY_GEN, "--fewshot-data", str(pool), "--shots", "2", "--out", str(out))) == 0
    prompts = [record["prompt"] for record in EvalResults.read(out).samples]
    assert all("Q0?" in prompt and "Q1?" in prompt for prompt in prompts)


# ------------------------------------------------------------------ 2. a setting given twice

@pytest.mark.parametrize("argv, message", [
    (gsm8k_run(TINY_GEN, "--temperature", "0.5", "-o", "temperature=0.9"),
     "error: temperature is given twice, as --temperature 0.5 and as -o temperature=0.9; give it once"),
    (gsm8k_run(TINY_GEN, "--cache", "none", "-o", "cache=dual"),
     "error: cache is given twice, as --cache none and as -o cache=dual; give it once"),
    (gsm8k_run(TINY_GEN, "-o", "gen-length=8"), "error: gen_length is given twice"),  # and --gen-length 2
    (["generate", "--model", "tiny:llada", "--prompt", "hi", "--seed", "3", "-o", "seed=9"],
     "error: seed is given twice, as --seed 3 and as -o seed=9; give it once"),
    (gsm8k_run(TINY_GEN, "-o", "threshold=0.7", "-o", "threshold=0.5"),
     "error: -o sets threshold twice (threshold=0.7 and threshold=0.5); give it once"),
    (mmlu_run("-o", "mc_samples=8"), "error: mc_samples is given twice, as --mc-samples 1 and as -o mc_samples=8"),
    (gsm8k_run(TINY_GEN, "-o", "seed=9"), "error: -o seed=9 is not used by dare eval: pass --seed 9"),
    (["eval", "sweep", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", TINY_GEN, "--out", "{out}",
      "--point", "sampler=fastdllm,threshold=0.7,threshold=0.5"],
     "error: --point 'sampler=fastdllm,threshold=0.7,threshold=0.5' sets threshold twice"),
    (["eval", "sweep", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", TINY_GEN, "--out", "{out}",
      "--grid", "sampler=llada:seed=1,2"], "error: point 0 (sampler=llada, seed=1): --point/--grid seed=1 is not used by dare eval: pass --seed 1"),
])
def test_a_setting_given_twice_is_a_one_line_error(argv, message, tmp_path, capsys, no_model):
    argv = [str(tmp_path / "sweep") if a == "{out}" else a for a in argv]
    assert one_line_error(capsys, *argv).startswith(message)


def test_the_same_option_value_given_twice_is_accepted_as_for_a_flag():
    """Before: ``-o cache=none -o cache=none`` was "-o sets cache twice", while ``--gen-length 4 --gen-length 4``
    is accepted (the same value changes nothing); values of different types still differ."""
    from dare.commands.generate import parse_options
    from dare.errors import ConfigError

    assert parse_options(["cache=none", "cache=none", "temperature=0.5", "temperature=.5"]) == {
        "cache": "none", "temperature": 0.5}
    for first, second in (("steps=1", "steps=true"), ("steps=1", "steps=1.0"), ("cache=none", "cache=dual")):
        with pytest.raises(ConfigError, match="-o sets steps twice|-o sets cache twice"):
            parse_options([first, second])


def test_the_same_value_by_flag_and_by_option_is_accepted():
    """Before: ``--temperature 0.5 -o temperature=0.5`` was "temperature is given twice"; different values (and a
    boolean for a number) still are."""
    from dare.commands.generate import reject_flag_and_option
    from dare.errors import ConfigError

    reject_flag_and_option({"temperature": 0.5, "steps": 4, "cache": "none"},
                           {"temperature": 0.5, "steps": 4.0, "cache": "none"})
    for flags, options in (({"temperature": 0.5}, {"temperature": 0.9}), ({"steps": 1}, {"steps": True})):
        with pytest.raises(ConfigError, match="is given twice"):
            reject_flag_and_option(flags, options)


def test_block_steps_in_likelihood_mode_is_refused_like_every_other_decoding_flag(capsys, no_model):
    line = one_line_error(capsys, *mmlu_run("--block-steps", "4"))
    assert line == "error: --block-steps applies to generation; mmlu is scored by likelihood here (add --mode generate)"


# ------------------------------------------------------------------ 3. --fewshot-data that is not used

def test_fewshot_data_with_zero_shots_warns_that_it_is_unused(tmp_path, caplog, capsys):
    missing = tmp_path / "nowhere.jsonl"
    with caplog.at_level(logging.WARNING, logger="dare"):
        assert main(gsm8k_run(TINY_GEN, "--fewshot-data", str(missing))) == 0
        assert main(gsm8k_run(TINY_GEN, "--fewshot-data", str(missing), "--shots", "0")) == 0
    assert [w for w in warnings_of(caplog) if "finish=length" not in w] == [
        f"warning: ignoring --fewshot-data {missing}: prompts are 0-shot (gsm8k's default); pass --shots N to use N "
        "exemplars from it",
        f"warning: ignoring --fewshot-data {missing}: prompts are 0-shot; pass --shots N to use N exemplars from it"]


# ------------------------------------------------------------------ 4. code rows without tests

HUMANEVAL = {"task_id": "HumanEval/0", "prompt": "def one():\n", "canonical_solution": "    return 1\n",
             "test": "def check(candidate):\n    assert candidate() == 1\n", "entry_point": "one"}
MBPP = {"task_id": 11, "text": "Return 1.", "code": "def one():\n    return 1", "test_list": ["assert one() == 1"]}


@pytest.mark.parametrize("bench_name, row, message", [
    ("mbpp", {**MBPP, "test_list": []}, "error: mbpp: row 0 is malformed: task 11 has no tests ('test_list' is empty)"),
    ("mbpp", {**MBPP, "test_list": ["  "]}, "error: mbpp: row 0 is malformed: task 11 has no tests"),
    ("mbpp", {**MBPP, "test_list": "assert one() == 1"}, "error: mbpp: row 0 is malformed: 'test_list' must be a list"),
    ("humaneval", {**HUMANEVAL, "test": ""}, "error: humaneval: row 0 is malformed: task 'HumanEval/0' has no tests"),
    ("humaneval", {**HUMANEVAL, "test": "assert one() == 1\n"},
     "error: humaneval: row 0 is malformed: task 'HumanEval/0': 'test' does not define check(candidate)"),
])
def test_code_rows_without_tests_are_rejected_when_loading(bench_name, row, message, tmp_path, capsys, no_model):
    data = write_jsonl(tmp_path / "code.jsonl", [row])
    line = one_line_error(capsys, "eval", "run", "--model", "tiny:llada", "--benchmark", bench_name, "--data", str(data))
    assert line.startswith(message)


def test_code_rows_with_tests_still_load():
    assert get_benchmark("mbpp").parse_row(MBPP, 0).target["tests"] == ["assert one() == 1"]
    csv_row = {**MBPP, "test_list": '["assert one() == 1"]'}  # a csv file holds the list as text
    assert get_benchmark("mbpp").parse_row(csv_row, 0).target["tests"] == ["assert one() == 1"]
    assert get_benchmark("humaneval").parse_row(HUMANEVAL, 0).target["tests"][0].endswith("check(one)\n")


# ------------------------------------------------------------------ 5. sweep grids and stale point files

@pytest.mark.parametrize("grid, message", [
    ("sampler=fastdllm,cache=prefix:threshold=0.9,0.5:steps=2,4",
     "error: --grid varies one key ([KEY=VALUE,...:]KEY=V1,V2,...); 'sampler=fastdllm,cache=prefix:threshold=0.9,0.5:"
     "steps=2,4' varies threshold and steps: give one --grid per value of the other keys, or one --point per "
     "combination, e.g. --grid sampler=fastdllm,cache=prefix,steps=2:threshold=0.9,0.5"),
    ("threshold=0.9,0.5:steps=2,4", "error: --grid varies one key, the one after the ':'"),
    ("threshold=0.5,0.7,steps=4", "error: --grid varies one key (threshold) after the ':'; 'steps=4' is a fixed setting"),
    ("sampler=fastdllm,threshold=0.9:threshold=0.5,0.7",
     "error: --grid 'sampler=fastdllm,threshold=0.9:threshold=0.5,0.7' sets threshold both before the ':' and as the "
     "varied key"),
])
def test_grid_mistakes_are_grid_errors(grid, message, tmp_path, capsys, no_model):
    line = one_line_error(capsys, "eval", "sweep", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", TINY_GEN,
                          "--out", str(tmp_path / "sweep"), "--grid", grid)
    assert line.startswith(message) and "--point expects" not in line


def fake_results(fields):
    return EvalResults(benchmark="gsm8k", metrics={"accuracy": 1.0}, samples=[{"tokens": 2, "steps": 1}],
                       sampler={"settings": {"sampler": "llada", "decoder": "quota", **fields}}, timings={"nfe": 1})


def test_a_rerun_with_fewer_points_leaves_no_stale_point_files(tmp_path):
    from dare.eval.sweep import run_sweep

    out = tmp_path / "sweep"
    run_sweep(fake_results, [{"steps": s} for s in (8, 4, 2)], out, log=lambda line: None)
    (out / "notes.txt").write_text("mine")
    (out / "points" / "best.json").write_text("{}")
    lines = []
    rows = run_sweep(fake_results, [{"steps": 1}], out, log=lines.append)
    assert sorted(p.name for p in (out / "points").iterdir()) == ["00.json", "best.json"]
    assert (out / "notes.txt").read_text() == "mine"
    assert [r["results"] for r in json.loads((out / "summary.json").read_text())["points"]] == ["points/00.json"]
    assert rows[0]["settings"] == {"steps": 1} and lines[0].startswith("removed ")
    assert json.loads((out / "points" / "00.json").read_text())["sampler"]["settings"]["steps"] == 1


# ------------------------------------------------------------------ 6. messages that say what to do

def test_an_unknown_prediction_id_shows_the_real_ids(tmp_path, capsys):
    preds = write_jsonl(tmp_path / "p.jsonl", [{"id": 0, "prediction": "The answer is 27."}])
    line = one_line_error(capsys, "eval", "score", "--benchmark", "gsm8k", "--predictions", str(preds), "--data",
                          TINY_GEN)
    assert line == (f"error: {preds}:1: id '0' is not in --data; its ids look like 'gsm8k/0', 'gsm8k/1', 'gsm8k/2', "
                    "... (did you mean 'gsm8k/0'?)")


def test_empty_choices_say_they_are_empty(tmp_path, capsys, no_model):
    data = write_jsonl(tmp_path / "mc.jsonl", [{"question": "1 + 1?", "choices": [], "answer": 0}])
    line = one_line_error(capsys, "eval", "run", "--model", "tiny:llada", "--benchmark", "mmlu", "--data", str(data))
    assert line == "error: mmlu: row 0 is malformed: 'choices' is empty: a multiple-choice row needs at least 2 options"


def test_a_pool_too_small_for_the_default_shots_says_what_to_pass(tmp_path, capsys, no_model):
    data = write_jsonl(tmp_path / "mc.jsonl", [json.loads(Path(TINY_MC).read_text().splitlines()[0])])
    line = one_line_error(capsys, "eval", "run", "--model", "tiny:llada", "--benchmark", "mmlu", "--data", str(data))
    assert line == ("error: mmlu: 5-shot prompts need 5 exemplars with solutions besides the problem itself, the pool "
                    "has 0: pass fewer shots (--shots 0) or a larger pool (--fewshot-data FILE)")


def test_the_python_api_refuses_settings_its_mode_would_drop(caplog):
    """evaluate() used to drop a sampler in likelihood mode, a likelihood config in generation, n > 1 and a template
    in likelihood mode without a word (the CLI refused the same flags); a sampler seed is replaced by EvalConfig's."""
    from dare.errors import ConfigError
    from dare.eval import EvalConfig, LikelihoodConfig, evaluate
    from dare.models import load_model
    from dare.models.loading import load_tokenizer
    from dare.rollout import SamplerConfig

    model, tokenizer = load_model("tiny:llada"), load_tokenizer("tiny:llada")
    mc, gen = get_benchmark("mmlu"), get_benchmark("gsm8k")
    mc_samples, gen_samples = mc.load(TINY_MC, limit=1), gen.load(TINY_GEN, limit=1)
    refused = [
        (mc, mc_samples, dict(sampler=SamplerConfig(gen_length=8)), "sampler applies to generation"),
        (mc, mc_samples, dict(config=EvalConfig(num_samples=4, shots=0)), "num_samples > 1 applies to generation"),
        (mc, mc_samples, dict(config=EvalConfig(template="cot", shots=0)), "template applies to generation"),
        (gen, gen_samples, dict(likelihood=LikelihoodConfig(mc_samples=3)),
         "likelihood applies to EvalConfig.mode 'likelihood'"),
    ]
    for bench, samples, kwargs, message in refused:
        with pytest.raises(ConfigError, match=f"^{message}"):
            evaluate(model, tokenizer, bench, samples, **kwargs)
    with caplog.at_level(logging.WARNING, logger="dare.eval"):
        results = evaluate(model, tokenizer, gen, gen_samples, sampler=SamplerConfig(gen_length=8, seed=5),
                           config=EvalConfig(shots=0))
    assert results.sampler["settings"]["seed"] == 0
    assert "warning: ignoring sampler.seed=5: evaluation seeds everything with EvalConfig.seed (0)" in caplog.messages


def test_score_refuses_one_id_with_two_answers_and_pools_one_id_with_one(tmp_path, capsys):
    """Before: the second line was graded against the first line's answer (two problems pooled as two samples of
    one, its own answer dropped); lines of one id with the same answer stay samples of one problem (pass@2)."""
    conflict = tmp_path / "conflict.jsonl"
    conflict.write_text('{"id": "a", "prediction": "42", "answer": "42"}\n{"id": "a", "prediction": "7", "answer": "7"}\n')
    assert one_line_error(capsys, "eval", "score", "--benchmark", "gsm8k", "--predictions", conflict) == (
        f"error: {conflict}:2: id 'a' was given before ({conflict}:1) with another answer ('42', here '7'); lines of "
        "one id are samples of one problem: give each problem its own id")
    pooled = tmp_path / "pooled.jsonl"
    pooled.write_text('{"id": "a", "prediction": "42", "answer": "42"}\n{"id": "a", "prediction": "7", "answer": "42"}\n')
    assert main(["eval", "score", "--benchmark", "gsm8k", "--predictions", str(pooled), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_problems"] == 1 and result["metrics"]["pass@2"] == 1.0 and result["metrics"]["accuracy"] == 0.5


def test_likelihood_mode_ends_with_its_line_as_generation_does(tmp_path, capfd):
    """Before: the likelihood bar was transient (a line only after 30 s), so a run said nothing before its JSON."""
    rows = write_jsonl(tmp_path / "mmlu.jsonl", [{"question": f"{i} + 1?", "choices": ["1", "2", "3", "4"],
                                                  "answer": i % 4} for i in range(3)])
    assert main(["eval", "run", "--model", "tiny:llada", "--benchmark", "mmlu", "--data", str(rows), "--shots", "0",
                 "--json"]) == 0
    err = capfd.readouterr().err.splitlines()
    assert any(line.startswith("mmlu (likelihood): ") and "(100%)" in line for line in err), err


def test_a_benchmark_whose_reward_is_unknown_fails_before_generating(monkeypatch):
    """Before: a plug-in benchmark's misspelt reward was found after every completion was generated (hours on an 8B
    model)."""
    import dataclasses

    import dare.rollout
    from dare.eval import evaluate
    from dare.eval.run import load_for_eval

    def no_generation(*args, **kwargs):
        raise AssertionError("generated before the reward was checked")

    model, tokenizer, _ = load_for_eval("tiny:llada", None, "cpu", None)
    bench = dataclasses.replace(get_benchmark("gsm8k"), name="gsm8k_typo", reward="exact_mach")
    samples = get_benchmark("gsm8k").load(TINY_GEN, limit=1)
    monkeypatch.setattr(dare.rollout, "generate", no_generation)
    from dare.errors import ConfigError

    with pytest.raises(ConfigError, match="^unknown reward 'exact_mach' \\(did you mean 'exact_match'\\?"):
        evaluate(model, tokenizer, bench, samples)
