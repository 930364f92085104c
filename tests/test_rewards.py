"""Reward plug-ins: countdown, sudoku, code, format rewards, presets and the registry."""

from fractions import Fraction

import pytest

from dare.errors import ConfigError, InputError
from dare.rewards import PRESETS, REWARDS, RewardResult, get_reward
from dare.rewards.countdown import InvalidExpression, evaluate

CD = {"numbers": [3, 5, 7], "target": 16}


def cd(text, sample=CD):
    return get_reward("countdown").score([text], [sample])[0]


# ------------------------------------------------------------------------------------ countdown

def test_countdown_correct_and_d1_scores():
    ok = cd("<answer>\n3*7-5\n</answer>")
    assert ok.correct and ok.reward == 1.0 and ok.extracted == "3*7-5"
    wrong = cd("<answer>3+5+7</answer>")  # valid numbers, evaluates to 15
    assert not wrong.correct and wrong.reward == pytest.approx(0.1) and "15" in wrong.info["why"]
    assert cd("I give up").reward == 0.0  # nothing extracted: d1 returns 0


@pytest.mark.parametrize(
    "expression, why",
    [
        ("3*7-5-5", "exactly once"),  # reuse
        ("3*5+1", "exactly once"),  # missing 7 and a foreign 1
        ("37-5*3-6", "exactly once"),  # digits glued together
        ("__import__('os').system('true')", "not allowed"),
        ("(lambda: 16)()", "not allowed"),
        ("3**2+7", "not allowed"),  # powers are not among + - * /
        ("3.0*7-5", "not allowed"),  # floats are not the given integers
        ("7/(5-5)+3", "division by zero"),
        ("3*7-", "not an expression"),
    ],
)
def test_countdown_rejects(expression, why):
    result = cd(f"<answer>{expression}</answer>")
    assert not result.correct and result.reward == pytest.approx(0.1)
    assert why in result.info["why"]


def test_countdown_exact_division_and_latex():
    sample = {"numbers": [3, 1, 3, 7], "target": 7}
    assert cd("<answer>(1/3)*3*7</answer>", sample).correct  # exact rationals: (1/3)*3 == 1
    assert cd("<answer>7 \\times (3 - 3 + 1)</answer>", sample).correct
    assert cd("\\boxed{7 \\div 1 \\times 3 / 3}", sample).correct
    assert cd("<answer>3*7-5 = 16</answer>").correct  # trailing '= target' ignored (d1 eval)
    assert evaluate("8/3") == (Fraction(8, 3), [8, 3])
    with pytest.raises(InvalidExpression):
        evaluate("x + 1")


# --------------------------------------------------------------------------------------- sudoku

PUZZLE, SOLUTION = "3102200002100320", "3142243142131324"  # a row of d1's 4x4_test_sudoku.csv


def test_sudoku_full_and_partial_credit():
    reward = get_reward("sudoku")
    full = reward.score([f"<answer>\n{SOLUTION}\n</answer>"], [{"puzzle": PUZZLE, "solution": SOLUTION}])[0]
    assert full.correct and full.reward == 1.0 and full.partial == 1.0
    empty = [i for i, c in enumerate(PUZZLE) if c == "0"]
    broken = list(SOLUTION)
    for i in empty[:3]:  # 3 of the 8 empty cells wrong
        broken[i] = "4" if SOLUTION[i] != "4" else "1"
    part = reward.score([f"<answer>{''.join(broken)}</answer>"], [{"puzzle": PUZZLE, "solution": SOLUTION}])[0]
    assert len(empty) == 8 and not part.correct
    assert part.partial == pytest.approx(5 / 8) and part.reward == pytest.approx(5 / 8)
    assert part.info == {"empty_cells": 8, "correct_cells": 5}


def test_sudoku_padding_formats_and_grids():
    reward = get_reward("sudoku")
    sample = {"puzzle": PUZZLE, "solution": SOLUTION}
    short = reward.score(["<answer>3142</answer>"], [sample])[0]  # d1 pads with '0'; only cell 2 is empty+right
    assert short.partial == pytest.approx(1 / 8) and short.info["correct_cells"] == 1
    rows = "\n".join(" ".join(SOLUTION[r * 4:(r + 1) * 4]) for r in range(4))
    assert reward.score([f"The grid:\n{rows}"], [sample])[0].correct  # reasoning-gym style rows, no tags
    grids = {"puzzle": [[3, 1, 0, 2], [2, 0, 0, 0], [0, 2, 1, 0], [0, 3, 2, 0]],
             "solution": [[int(c) for c in SOLUTION[r * 4:(r + 1) * 4]] for r in range(4)]}
    assert reward.score([f"<answer>{SOLUTION}</answer>"], [grids])[0].correct
    assert reward.score(["no digits"], [sample])[0].reward == 0.0


def test_sudoku_alternative_valid_solution_counts():
    # a puzzle with two solutions: any valid completion that keeps the givens is correct
    solution = "1234341221434321"
    puzzle = "1200340000000000"
    other = "1234341243212143"
    result = get_reward("sudoku").score([f"<answer>{other}</answer>"], [{"puzzle": puzzle, "solution": solution}])[0]
    assert result.correct and result.partial == 1.0
    invalid = "1234341221434312"  # last row breaks a column
    assert not get_reward("sudoku").score([f"<answer>{invalid}</answer>"], [{"puzzle": puzzle, "solution": solution}])[0].correct


# ----------------------------------------------------------------------------------------- code

CODE_SAMPLE = {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]}


def test_code_reward_fraction_and_format_gating():
    reward = get_reward("code", timeout=10, workers=2)
    good = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"
    half = "```python\ndef add(a, b):\n    return a + b if a > 0 else 5\n```\n"
    exits = "```python\nimport sys\ndef add(a, b):\n    sys.exit(0)\n```\n"
    r = reward.score([good, half, exits], [CODE_SAMPLE] * 3)
    assert [x.correct for x in r] == [True, False, False]
    assert [x.partial for x in r] == [1.0, pytest.approx(2 / 3), 0.0]
    gated = get_reward("coupled_grpo_code")
    prose_only = "def add(a, b):\n    return a + b\n"  # correct code but no fenced block
    g = gated.score([good, prose_only], [CODE_SAMPLE] * 2)
    assert g[0].reward == pytest.approx(2.0 * 1.0 + 0.5 * 1.0) and g[0].components == {"code": 2.0, "code_format": 0.5}
    assert g[1].reward == 0.0 and g[1].info["code"]["status"] == "bad_format"


def test_code_format_reward_diffucoder_rules():
    fmt = get_reward("code_format")
    assert fmt(["Sure.\n```python\nx = 1\n```\n"]  , [{}]) == [1.0]
    assert fmt(["```python\nx = (\n```\n"], [{}]) == [0.5]  # syntax error: partial
    assert fmt(["```python\nx = 1\n```\ntrailing words"], [{}]) == [0.0]  # must end the text
    assert fmt(["```python\nx=1\n```\n```python\ny=2\n```\n"], [{}]) == [0.0]  # exactly one block


# -------------------------------------------------------------------------------------- formats

D1_GOOD = "<reasoning>\nadd\n</reasoning>\n<answer>\n42\n</answer>\n"


def test_d1_format_rewards_and_preset():
    assert get_reward("xml_count")([D1_GOOD], [{}]) == [pytest.approx(0.5)]
    assert get_reward("xml_count")([D1_GOOD + "junk"], [{}]) == [pytest.approx(0.5 - 2 * 0.004)]
    assert get_reward("strict_format")([D1_GOOD, D1_GOOD.strip()], [{}, {}]) == [1.0, 0.0]
    assert get_reward("soft_format")(["<reasoning>x</reasoning> <answer>1</answer>"], [{}]) == [1.0]
    assert get_reward("integer_answer")([D1_GOOD, "<answer>4.2</answer>"], [{}, {}]) == [1.0, 0.0]
    # d1's soft pattern has no DOTALL, so multi-line tag contents fail it (kept as in the reference)
    assert get_reward("soft_format")([D1_GOOD], [{}]) == [0.0]
    d1 = get_reward("d1_gsm8k").score([D1_GOOD], [{"answer": "42"}])[0]
    # correctness 2.0 + xmlcount 0.5 + soft 0 + strict 0.5 + int 0.5 (d1 diffu_grpo_train.py, gsm8k)
    assert d1.reward == pytest.approx(3.5) and d1.correct and d1.components["gsm8k"] == 2.0
    boxed = get_reward("boxed_format")(["<answer>\\boxed{3}</answer>", "<answer>3</answer>", "3"], [{}] * 3)
    assert boxed == [2.0, 1.5, 0.5]


# ------------------------------------------------------------------------------------- registry

def test_registry_errors_and_batch_checks():
    with pytest.raises(ConfigError, match="did you mean 'countdown'"):
        get_reward("countdwn")
    with pytest.raises(ConfigError, match="reward 'math'"):
        get_reward("math", bogus=1)
    with pytest.raises(InputError, match="lacks numbers"):
        get_reward("countdown").score(["x"], [{"target": 3}])
    with pytest.raises(InputError, match="2 completions for 1 samples"):
        get_reward("math").score(["a", "b"], [{"answer": "1"}])
    assert {"math", "gsm8k", "countdown", "sudoku", "code", "choice"} <= set(REWARDS)
    assert all(isinstance(get_reward(name), object) for name in PRESETS)


@pytest.mark.parametrize("spec, message", [
    ({"exact_match": "abc"}, "reward 'exact_match': the weight must be a number; got 'abc'"),
    ({"exact_match": None}, "reward 'exact_match': the weight must be a number; got None"),
    ({"exact_match:2.0": None}, "YAML needs a space after the colon"),  # `{exact_match:2.0}` in a recipe
    ({"exact_match": {"weight": [1]}}, "reward 'exact_match': the weight must be a number"),
    (["exact_match"], "reward must be a name or a mapping {name: weight}; got ['exact_match']"),
    (3, "reward must be a name or a mapping {name: weight}; got 3"),
])
def test_a_malformed_reward_spec_is_a_one_line_config_error(spec, message):
    with pytest.raises(ConfigError) as err:
        get_reward(spec)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert get_reward({"exact_match": "2.0"}).score(["a"], [{"answer": "a"}])[0].reward == 2.0


def test_weighted_sum_reports_components_apart_from_accuracy():
    combo = get_reward({"math": 2.0, "boxed_format": 0.5})
    r = combo.score(["<answer>\\boxed{4}</answer>", "<answer>\\boxed{5}</answer>"], [{"answer": "4"}] * 2)
    assert isinstance(r[0], RewardResult)
    assert r[0].correct and r[0].reward == pytest.approx(2.0 + 0.5 * 2.0)
    assert not r[1].correct and r[1].reward == pytest.approx(1.0) and r[1].components == {"math": 0.0, "boxed_format": 1.0}


def test_an_integer_choice_answer_is_an_option_index():
    """MMLU's native rows store the answer as an index; it used to be compared with the letter and score 0."""
    reward = get_reward("choice")
    scores = [r.reward for r in reward.score(["The answer is (B)", "The answer is (A)", "(B)", "(B)"],
                                             [{"answer": 1}, {"answer": 1}, {"answer": "B"}, {"answer": 7}])]
    assert scores == [1.0, 0.0, 1.0, 0.0]  # 7: outside ABCD, compared as text


def test_a_string_of_completions_or_a_benchmark_sample_is_a_one_line_error():
    from dare.eval import get_benchmark

    reward = get_reward("gsm8k")
    with pytest.raises(InputError, match=r"^reward 'gsm8k': completions must be a list of strings; got one string"):
        reward.score("27", [{"answer": "27"}])
    sample = get_benchmark("gsm8k").parse_row({"question": "1 + 1?", "answer": "#### 2"}, 0)
    with pytest.raises(InputError, match=r"sample 0 is a Sample, expected a mapping of its fields \(a benchmark "
                                         r"Sample: pass its \.target\)$"):
        reward.score(["2"], [sample])
    assert reward.score(["The answer is 2"], [sample.target])[0].reward == 1.0


# ------------------------------------------------------------------------------------ parsing in threads

def test_test_snippets_parse_in_many_threads_while_finalizers_run():
    """The sandbox's worker threads split test snippets at once. On CPython 3.11 two ASTs built at the same time
    (a thread switch inside the construction, e.g. while the garbage collector runs a finalizer) raised
    ``SystemError: AST constructor recursion depth mismatch`` on valid code; the parses are serialised now."""
    import sys
    import threading

    from dare.rewards.test_cases import split_test

    snippet = ("def check(candidate):\n"
               + "".join(f"    assert candidate([{i}, [1, (2, {{'a': [3]}})]], 'x') == [[{i}]]\n" for i in range(100))
               + "check(f)\n")
    expected = split_test(snippet)
    assert expected is not None and len(expected) == 100

    class Finalized:
        def __del__(self):
            sum(range(50))  # Python code run by the collector: a thread switch can happen here

    results, errors = [], []

    def work():
        for _ in range(150):
            a, b = Finalized(), Finalized()
            a.other, b.other = b, a  # a cycle: freed by the collector, possibly inside another thread's parse
            del a, b
            try:
                results.append(split_test(snippet))
            except SystemError as error:
                errors.append(error)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:1]
    assert len(results) == 600 and all(r == expected for r in results)
