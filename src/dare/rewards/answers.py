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
  would read ``1,000`` as ``000``: we follow lm-eval), equality within an absolute 1e-6 (OpenCompass
  ``Gsm8kEvaluator.is_equal``).
* **multiple choice** - the ordered English subset of OpenCompass ``first_option_postprocess``:
  explicit statements (``the answer is (B)``, ``Answer: B``, ``\\boxed{B}``, ``**B**``) first, then a
  leading ``B.``/``(B)``, then the first standalone option letter.
"""

from __future__ import annotations

import re
from fractions import Fraction

from dare.rewards.worker import BoundedWorker

# ----------------------------------------------------------------------------------------- boxes


_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*(\{)?")
_STOP = re.compile(r"[\s$]")
_BRACE = re.compile(r"[{}]")


def _boxed_spans(text: str) -> list[tuple[int, int, int]]:
    """Every ``\\boxed{..}`` / ``\\fbox{..}`` / ``\\boxed x`` in ``text`` as (start, content start,
    content end), in order of their start. One pass over the braces with a stack (linear time: an
    unclosed box is never rescanned, so adversarial text cannot make this quadratic)."""
    opens: dict[int, tuple[int, int]] = {}  # index of a box's "{" -> (start of "\boxed", start of content)
    spans, end = [], -1
    for match in _BOX_OPEN.finditer(text):
        if match.group(1) is not None:
            opens[match.end() - 1] = (match.start(), match.end())
            continue
        if end < match.end():  # "\boxed 5" form: content runs to the next space or '$' (found once per run)
            stop = _STOP.search(text, match.end())
            end = stop.start() if stop else len(text)
        if end > match.end():
            spans.append((match.start(), match.end(), end))
    if opens:
        stack: list[int] = []
        for brace in _BRACE.finditer(text):
            if brace.group() == "{":
                stack.append(brace.start())
            elif stack:
                opened = stack.pop()
                if opened in opens:
                    start, content = opens[opened]
                    spans.append((start, content, brace.start()))
    spans.sort(key=lambda span: span[0])
    return spans


def all_boxed(text: str) -> list[str]:
    """Contents of every box in order of appearance (unbalanced boxes are skipped)."""
    return [text[a:b].strip() for _, a, b in _boxed_spans(text)]


MAX_OPEN_BOXES = 1000
"""Boxes :func:`last_boxed` tries, from the last one backwards (more unclosed ones after the answer: none)."""


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (nested braces kept), or None.

    Boxes are tried from the last one backwards (at most ``MAX_OPEN_BOXES``), and each brace box is
    scanned only up to where the next box starts: every later box is then known to be unclosed, and
    an unclosed box inside (or after) this one keeps it open too. So the text is read about once."""
    limit = len(text)
    found = {"\\boxed": limit, "\\fbox": limit}  # last occurrence before `limit` of each (-1: none left)
    for _ in range(MAX_OPEN_BOXES):
        for word, at in found.items():
            if at >= limit:  # each word is searched only behind its previous hit: one pass in total
                found[word] = text.rfind(word, 0, limit)
        start = max(found.values())
        if start < 0:
            return None
        match = _BOX_OPEN.match(text, start)
        content = match.end()
        if match.group(1) is None:  # "\boxed 5" form: content runs to the next space or '$'
            stop = _STOP.search(text, content)
            end = stop.start() if stop else len(text)
            if end > content:
                return text[content:end].strip()
        elif text.find("}", content, limit) >= 0:
            depth = 1
            for brace in _BRACE.finditer(text, content, limit):
                depth += 1 if brace.group() == "{" else -1
                if depth == 0:
                    return text[content:brace.start()].strip()
        limit = start
    return None


def answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` (d1 ``extract_solution``), or None."""
    last, pos = None, 0
    while True:  # str.find moves forward only: linear in len(text) however many tags are unclosed
        start = text.find("<answer>", pos)
        end = text.find("</answer>", start + 8) if start >= 0 else -1
        if end < 0:
            return last
        last, pos = text[start + 8:end].strip(), end + 9


# --------------------------------------------------------------------------------------- numbers

MAX_NUMBER_CHARS = 1000
"""Longest number (characters after clean-up) :func:`parse_number` reads; longer text is not a number."""
_NUMBER = re.compile(r"-?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
_ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*:?\s*(.+)", re.IGNORECASE)


def parse_number(text: str | None, units: bool = True) -> Fraction | None:
    """Read one number written as ``1,000``, ``$5.50``, ``50%``, ``-3``, ``1/2``, ``\\frac{1}{2}``,
    ``12 cm`` or ``\\text{12}``; None when it is not a single number. ``units=False``: a trailing word is not
    dropped (``2i``, ``3x`` are not numbers; math answers leave units to math-verify)."""
    if text is None:
        return None
    s = str(text).strip()
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "").replace("\\!", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("−", "-")
    s = s.replace("\\left", "").replace("\\right", "").replace("^\\circ", "").replace("^{\\circ}", "")
    if len(s) > 4 * MAX_NUMBER_CHARS:
        return None
    frac = re.fullmatch(r"(-?)\\frac\{\s*(-?\d+)\s*\}\{\s*(-?\d+)\s*\}", s.strip())
    if frac:
        sign, num, den = frac.groups()
        return None if int(den) == 0 else Fraction(int(num), int(den)) * (-1 if sign else 1)
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s).strip().rstrip(".")
    if units:
        s = _strip_unit_word(s)  # trailing unit word: "12 cm", "5 dollars"
    if len(s) > MAX_NUMBER_CHARS:  # bounded arithmetic: longer "numbers" are refused, not parsed
        return None
    ratio = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s*/\s*(-?\d+(?:\.\d+)?)", s)
    try:
        if ratio:
            den = Fraction(ratio.group(2))
            return None if den == 0 else Fraction(ratio.group(1)) / den
        return Fraction(s) if re.fullmatch(r"-?(?:\d+(?:\.\d*)?|\.\d+)", s) else None
    except (ValueError, ZeroDivisionError):
        return None


def _strip_unit_word(s: str) -> str:
    """``s`` without one trailing ASCII word (and its final '.') and the spaces before it; a plain
    character scan, since the equivalent regex ``\\s*[a-zA-Z°]+\\.?$`` is quadratic on long words."""
    end = len(s) - 1 if s.endswith(".") else len(s)
    i = end
    while i > 0 and (s[i - 1].isascii() and s[i - 1].isalpha() or s[i - 1] == "°"):
        i -= 1
    if i == end:
        return s
    return s[:i].rstrip()


def last_number(text: str) -> str | None:
    """The last number in ``text`` (thousands separators allowed), as written."""
    found = _NUMBER.findall(text)
    return found[-1].replace("$", "").replace(" ", "") if found else None


def numbers_equal(pred: str | None, gold: str | None, tol: float = 1e-6, units: bool = True) -> bool:
    """Numeric equality of two number strings (``1,000`` == ``1000.0``; ``1/2`` == ``0.5``) within an absolute
    ``tol`` (OpenCompass ``Gsm8kEvaluator.is_equal``; a relative one would accept 10000009 for 10000000).
    ``units``: as in :func:`parse_number`."""
    a, b = parse_number(pred, units), parse_number(gold, units)
    if a is None or b is None:
        return False
    # exact rational arithmetic: huge values compare correctly and never overflow a float
    return abs(a - b) <= Fraction(tol)


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

MATH_VERIFY_TIMEOUT = 5.0
"""Seconds one math-verify comparison may take (in a helper process, so it holds in any thread)."""
MATH_VERIFY_MAX_CHARS = 2000
"""Longer answers skip math-verify (plain comparison only): sympy on huge input is slow by design."""
_MATH_VERIFY = BoundedWorker("dare.rewards.math_check:verify_pair")


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
    # numbers without a trailing word only: "2i" or "3x" is not 2 or 3 (math-verify reads units such as \text{cm})
    if numbers_equal(pred, gold, units=False) or _normalise_text(pred) == _normalise_text(gold):
        return True
    if max(len(pred), len(gold)) > MATH_VERIFY_MAX_CHARS:
        return False
    # math-verify may hang inside sympy (C code, no signal gets through): a killable helper bounds it
    return bool(_MATH_VERIFY.call((_as_latex(gold), _as_latex(pred)), timeout=MATH_VERIFY_TIMEOUT, default=False))


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
