"""Answer extraction and equivalence shared by the rewards and the evaluation scorers.

Rules (each documented where it is applied; the table-driven tests in ``tests/test_answers.py`` cite
them):

* **boxed** - the *last* ``\\boxed{...}`` / ``\\fbox{...}`` with nested braces wins (OpenCompass
  ``last_boxed_only_string``, d1 ``parse_math_answers``); math-verify alone would read several boxes
  as a set, which neither reference does.
* **math equivalence** - math-verify (``verify(gold, pred)``) on the extracted answer wrapped in
  ``$...$``; it handles ``\\frac``/``\\dfrac``/decimals, ``\\left(``, intervals, units ``\\text{cm}``,
  degrees, ``\\%``, ``\\$``, thousands separators.
* **numbers (GSM8K)** - ``#### x`` > last ``\\boxed{}`` > ``<answer>`` tags > ``the answer is x`` >
  last number (OpenCompass ``gsm8k_postprocess``, truncated at a following ``Question:``); commas
  and ``$`` are dropped before comparing (lm-eval's gsm8k filters; OpenCompass keeps the comma and
  would read ``1,000`` as ``000``: we follow lm-eval), equality within 1e-6 (OpenCompass
  ``Gsm8kEvaluator.is_equal``).
* **multiple choice** - the ordered English subset of OpenCompass ``first_option_postprocess``:
  explicit statements (``the answer is (B)``, ``Answer: B``, ``\\boxed{B}``, ``**B**``) first, then a
  leading ``B.``/``(B)``, then the first standalone option letter.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction

# ----------------------------------------------------------------------------------------- boxes


def _boxed_spans(text: str) -> list[tuple[int, int, str]]:
    """Every ``\\boxed{..}`` / ``\\fbox{..}`` / ``\\boxed x`` in ``text`` as (start, end, content)."""
    spans = []
    for match in re.finditer(r"\\(?:boxed|fbox)\s*(\{)?", text):
        start = match.start()
        if match.group(1) is None:  # "\boxed 5" form: content runs to the next space or '$'
            rest = re.match(r"[^\s$]+", text[match.end():])
            if rest:
                spans.append((start, match.end() + rest.end(), rest.group(0)))
            continue
        depth, i = 0, match.end() - 1
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    spans.append((start, i + 1, text[match.end():i]))
                    break
            i += 1
    return spans


def all_boxed(text: str) -> list[str]:
    """Contents of every box in order of appearance (unbalanced boxes are skipped)."""
    return [content.strip() for _, _, content in _boxed_spans(text)]


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (nested braces kept), or None."""
    boxes = all_boxed(text)
    return boxes[-1] if boxes else None


def answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` (d1 ``extract_solution``), or None."""
    matches = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    return matches[-1].strip() if matches else None


# --------------------------------------------------------------------------------------- numbers

_NUMBER = re.compile(r"-?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
_ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*:?\s*(.+)", re.IGNORECASE)


def parse_number(text: str | None) -> Fraction | None:
    """Read one number written as ``1,000``, ``$5.50``, ``50%``, ``-3``, ``1/2``, ``\\frac{1}{2}``,
    ``12 cm`` or ``\\text{12}``; None when it is not a single number."""
    if text is None:
        return None
    s = str(text).strip()
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "").replace("\\!", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("−", "-")
    s = s.replace("\\left", "").replace("\\right", "").replace("^\\circ", "").replace("^{\\circ}", "")
    frac = re.fullmatch(r"(-?)\\frac\{\s*(-?\d+)\s*\}\{\s*(-?\d+)\s*\}", s.strip())
    if frac:
        sign, num, den = frac.groups()
        return None if int(den) == 0 else Fraction(int(num), int(den)) * (-1 if sign else 1)
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s).strip().rstrip(".")
    s = re.sub(r"\s*[a-zA-Z°]+\.?$", "", s).strip()  # trailing unit word: "12 cm", "5 dollars"
    ratio = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s*/\s*(-?\d+(?:\.\d+)?)", s)
    try:
        if ratio:
            den = Fraction(ratio.group(2))
            return None if den == 0 else Fraction(ratio.group(1)) / den
        return Fraction(s) if re.fullmatch(r"-?(?:\d+(?:\.\d*)?|\.\d+)", s) else None
    except (ValueError, ZeroDivisionError):
        return None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (thousands separators allowed), as written."""
    found = _NUMBER.findall(text)
    return found[-1].replace("$", "").replace(" ", "") if found else None


def numbers_equal(pred: str | None, gold: str | None, tol: float = 1e-6) -> bool:
    """Numeric equality of two number strings (``1,000`` == ``1000.0``; ``1/2`` == ``0.5``)."""
    a, b = parse_number(pred), parse_number(gold)
    if a is None or b is None:
        return False
    return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b)))


def gsm8k_gold(answer: str) -> str:
    """The gold number of a GSM8K ``answer`` field (text after ``####``, commas removed)."""
    text = str(answer)
    if "####" in text:
        text = text.split("####")[-1]
    return text.strip().replace(",", "").replace("$", "")


def extract_number_answer(text: str) -> str | None:
    """The final numeric answer of a GSM8K-style completion (module docstring, "numbers")."""
    text = text.split("\nQuestion:")[0]  # few-shot continuations ramble into the next question
    candidates = []
    if "####" in text:
        candidates.append(text.split("####")[-1].strip().split("\n")[0])
    boxed = last_boxed(text)
    if boxed is not None:
        candidates.append(boxed)
    tag = answer_tag(text)
    if tag is not None:
        candidates.append(tag)
    said = _ANSWER_IS.findall(text)
    if said:
        candidates.append(said[-1])
    for candidate in candidates:
        if parse_number(candidate) is not None:
            return candidate.strip().rstrip(".")
        number = last_number(candidate)
        if number is not None:
            return number
    return last_number(text)


# ------------------------------------------------------------------------------------------- math

def _timeout() -> int | None:
    # math-verify's timeouts use SIGALRM, which only the main thread may install.
    return 5 if threading.current_thread() is threading.main_thread() else None


def extract_math_answer(text: str) -> str | None:
    """The final answer of a MATH-style completion: last box > ``<answer>`` tag > "the answer is"."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    tag = answer_tag(text)
    if tag:
        return last_boxed(tag) or tag
    said = _ANSWER_IS.findall(text)
    if said:
        return said[-1].strip().rstrip(".").strip("$ ")
    return None


def math_gold(solution_or_answer: str) -> str:
    """The gold answer of a MATH row: the last box of a worked solution, else the text itself."""
    boxed = last_boxed(str(solution_or_answer))
    return boxed if boxed is not None else str(solution_or_answer).strip()


def _as_latex(answer: str) -> str:
    answer = answer.strip()
    return answer if answer.startswith("$") else f"${answer}$"


def math_equal(pred: str | None, gold: str | None) -> bool:
    """Whether two extracted answers are mathematically equal (math-verify, then numbers/strings)."""
    if pred is None or gold is None:
        return False
    from math_verify import parse, verify

    timeout = _timeout()
    try:
        gold_parsed = parse(_as_latex(gold), parsing_timeout=timeout)
        pred_parsed = parse(_as_latex(pred), parsing_timeout=timeout)
        if gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=timeout):
            return True
    except Exception:  # math-verify raises on pathological input; fall back to plain comparison
        pass
    if numbers_equal(pred, gold):
        return True
    return _normalise_text(pred) == _normalise_text(gold)


def _normalise_text(s: str) -> str:
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    return re.sub(r"[\s$]", "", s).rstrip(".").lower()


# ------------------------------------------------------------------------------- multiple choice

def extract_choice(text: str, labels: str | list[str] = "ABCD") -> str | None:
    """The option letter a completion commits to (module docstring, "multiple choice"), or None."""
    options = "".join(labels)
    if not options:
        return None
    opt = f"[{re.escape(options)}]"
    text = text.strip()
    explicit = [
        rf"\\boxed\{{\s*(?:\\text\{{)?\(?({opt})\)?",
        rf"answer\s+is\s*:?\s*(?:option\s*)?\(?\**\(?({opt})\b",
        rf"answer\s*:\s*\**\(?({opt})\b",
        rf"(?:correct|best)\s+(?:option|choice)\s+is\s*:?\s*\(?\**({opt})\b",
        rf"\*\*\(?({opt})\)?[.:)]?\*\*",
    ]
    for pattern in explicit:
        found = re.findall(pattern, text, re.IGNORECASE if pattern.startswith("answer") else 0)
        found = [f for f in found if f in options]
        if found:
            return found[-1]
    lead = re.match(rf"^\(?({opt})(?:[.):]|\s|$)", text)
    if lead:
        return lead.group(1)
    loose = re.search(rf"(?:^|[\s(\[])({opt})(?=$|[\s.,:;)\]])", text)
    return loose.group(1) if loose else None
