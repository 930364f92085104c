"""Answer extraction and equivalence on tricky cases, each row citing the reference rule it follows.

OC = OpenCompass (``datasets/math.py`` last_boxed_only_string / math_postprocess_v2,
``datasets/gsm8k.py`` gsm8k_postprocess + Gsm8kEvaluator, ``utils/text_postprocessors.py``
first_option_postprocess); d1 = dllm-reasoning/d1 ``eval/parse_and_get_acc.py``; MV = math-verify;
LM = lm-evaluation-harness gsm8k filters. Where they disagree the choice is stated in the row.
"""

import pytest

from dare.rewards import answers, get_reward

MATH = [
    # (completion, gold, correct, rule)
    ("so \\boxed{\\frac{1}{2}}", "0.5", True, "MV: fraction == decimal"),
    ("\\boxed{0.5}", "\\frac12", True, "MV: shorthand \\frac12"),
    ("\\boxed{1/2}", "\\dfrac{1}{2}", True, "MV: \\dfrac and a/b"),
    ("\\boxed{-\\frac{2}{3}}", "-2/3", True, "MV: signs"),
    ("\\boxed{1,000}", "1000", True, "MV/OC normalize_final_answer: thousands separator"),
    ("\\boxed{10\\text{ cm}}", "10", True, "MV units / OC REMOVED_EXPRESSIONS 'cm'"),
    ("\\boxed{30^\\circ}", "30", True, "OC/d1 strip ^\\circ"),
    ("\\boxed{50\\%}", "50", True, "d1 strip_string removes \\%"),
    ("\\boxed{\\$5}", "5", True, "d1/OC remove \\$"),
    ("\\boxed{\\left(1,2\\right)}", "(1,2)", True, "d1 strip \\left \\right"),
    ("\\boxed{[1,3)}", "[1,3)", True, "MV intervals"),
    ("\\boxed{(1,3]}", "[1,3)", False, "MV: interval ends matter"),
    ("first \\boxed{1} then \\boxed{2}", "2", True, "OC/d1 last box (MV alone would read the set {1,2})"),
    ("first \\boxed{1} then \\boxed{2}", "1", False, "OC/d1 last box"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", True, "nested braces; MV \\sqrt3"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True, "MV symbolic equality"),
    ("\\boxed{x=3}", "3", True, "MV: equation's right side"),
    ("\\boxed{0.333}", "\\frac13", False, "MV: 6-digit rounding, 0.333 != 1/3"),
    ("\\boxed{3,4}", "4,3", True, "MV: unordered answer lists"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True, "MV matrices"),
    ("\\boxed{\\text{(B)}}", "\\text{(B)}", True, "string answers"),
    ("\\boxed 5$", "5", True, "d1 last_boxed_only_string: '\\boxed 5' form"),
    ("The answer is 42.", "42", True, "OC math_postprocess_v2: 'answer is' sentence"),
    ("<reasoning>..</reasoning>\n<answer>\n7\n</answer>", "7", True, "d1 parse_math_answers: <answer> fallback"),
    ("I computed 42 somewhere", "42", False, "OC v2: no box/no 'answer is' -> first sentence, not a number hunt"),
    ("\\boxed{5}", "Solution text ... so $\\boxed{5}$.", True, "OC MATHDataset: gold = last box of the solution"),
    ("\\boxed{2}", "2i", False, "MV: 2i is not 2 (a letter after a number is no unit word in math)"),
    ("\\boxed{2i}", "2", False, "MV: 2i is not 2, either way round"),
    ("\\boxed{3}", "3x", False, "MV: 3x is not 3"),
    ("\\boxed{3y}", "3x", False, "MV: 3y is not 3x"),
    ("\\boxed{-5}", "-5i", False, "MV: -5i is not -5"),
    ("\\boxed{10000009}", "10000000", False, "OC is_equal: absolute 1e-6 (a relative one accepted this)"),
]


@pytest.mark.parametrize("completion, gold, correct, rule", MATH, ids=[r for *_, r in MATH])
def test_math_reward_table(completion, gold, correct, rule):
    result = get_reward("math").score([completion], [{"answer": gold}])[0]
    assert result.correct is correct
    assert result.reward == float(correct)


GSM8K = [
    ("3+4=7. The answer is 7.", "Janet has ... #### 7", True, "OC gsm8k_dataset_postprocess: gold after ####"),
    ("The answer is $1,000.", "1000", True, "LM: drop ',' and '$' (OC would read '000': we follow LM)"),
    ("#### 1,234", "1,234", True, "'#### x' answer line; commas dropped on both sides"),
    ("so it costs $18.00", "18", True, "OC Gsm8kEvaluator: float equality within 1e-6"),
    ("#### 10000009", "10000000", False, "OC Gsm8kEvaluator: absolute 1e-6, not relative to the gold"),
    ("#### 123456900", "123456789", False, "OC Gsm8kEvaluator: absolute 1e-6, not relative to the gold"),
    ("\\boxed{12} dollars, then 15 more later", "12", True, "d1 parse_gsm_answers: box first"),
    ("Answer: 8 apples\nQuestion: Tom has 9 pens", "8", True, "OC gsm8k_postprocess: cut at 'Question:'"),
    ("The answer is 0.5", "1/2", True, "numbers compared as values"),
    ("It is 50%.", "50", True, "percent sign dropped"),
    ("It dropped to -3 degrees", "-3", True, "OC regex keeps the sign"),
    ("<reasoning>\n6*7\n</reasoning>\n<answer>\n42\n</answer>", "42", True, "d1 <answer> tags"),
    ("1,000,000 people came", "1000000", True, "last number with separators"),
    ("First 3 then 4, total 12", "7", False, "OC: last number rule"),
    ("no number at all", "7", False, "nothing extracted"),
]


@pytest.mark.parametrize("completion, gold, correct, rule", GSM8K, ids=[r for *_, r in GSM8K])
def test_gsm8k_reward_table(completion, gold, correct, rule):
    assert get_reward("gsm8k").score([completion], [{"answer": gold}])[0].correct is correct


CHOICES = [
    ("The answer is (B).", "B", True, "OC: 'The answer is (X)'"),
    ("B. Paris", "B", True, "OC: leading option letter"),
    ("It must be **C**", "C", True, "bold letter"),
    ("Answer: D", "D", True, "OC: '(?i)ANSWER\\s*:\\s*X'"),
    ("\\boxed{A}", "A", True, "OC: boxed option"),
    ("I think A is wrong; the answer is C", "C", True, "explicit statement beats an earlier letter"),
    ("(B)", "B", True, "parenthesised letter"),
    ("The correct option is D.", "D", True, "OC: 'The correct option is'"),
    ("answer is: (J)", "J", True, "MMLU-Pro letters up to J"),
    ("a cat", "A", False, "lower-case words are not options"),
    ("Paris", "B", True, "exact option text counts as choosing it"),
]


@pytest.mark.parametrize("completion, gold, correct, rule", CHOICES, ids=[r for *_, r in CHOICES])
def test_choice_reward_table(completion, gold, correct, rule):
    sample = {"answer": gold, "labels": list("ABCDEFGHIJ"), "choices": ["London", "Paris", "Rome", "Oslo"]}
    assert get_reward("choice").score([completion], [sample])[0].correct is correct


def test_last_boxed_handles_nesting_and_unbalanced():
    assert answers.last_boxed("a \\boxed{\\frac{a}{b^{2}}} b") == "\\frac{a}{b^{2}}"
    assert answers.last_boxed("\\boxed{1} and \\fbox{2}") == "2"
    assert answers.last_boxed("\\boxed{1} and \\boxed{unclosed") == "1"
    assert answers.last_boxed("nothing") is None
    assert answers.all_boxed("\\boxed{1}, \\boxed{2}") == ["1", "2"]


@pytest.mark.parametrize(
    "text, value",
    [("1,000", 1000), ("$5.50", 5.5), ("50%", 50), ("-3", -3), ("1/2", 0.5), ("\\frac{3}{4}", 0.75),
     ("\\dfrac{-1}{4}", -0.25), ("12 cm", 12), ("\\text{7}", 7), ("7.", 7), ("x+1", None), ("1/0", None), ("", None)],
)
def test_parse_number(text, value):
    parsed = answers.parse_number(text)
    assert (parsed is None) if value is None else float(parsed) == value


def test_math_equal_from_worker_thread():
    """math-verify's SIGALRM timeouts only work in the main thread; equality must still hold elsewhere."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(lambda p: answers.math_equal(*p), [("\\frac12", "0.5"), ("2", "3")])) == [True, False]
