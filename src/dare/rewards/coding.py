"""The ``code`` reward: run the completion's Python against the sample's tests in the sandbox.

Samples carry ``tests`` (snippets such as ``assert f(1) == 2`` or HumanEval's ``check(...)`` code), and
optionally ``prompt`` (HumanEval's function header, prepended so imports and signatures exist),
``entry_point`` and ``setup`` (MBPP's ``test_setup_code``). As in DiffuCoder's ``code_reward`` the
reward is the fraction of tests passed (``partial``), ``correct`` means all passed; with
``require_format=True`` (the Coupled-GRPO preset) only a well-formed single ```` ```python ```` answer
is executed, as DiffuCoder does. The verdict is decided outside the candidate's process
(:mod:`dare.rewards.sandbox`, ``docs/security.md``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dare.rewards.base import Reward, RewardResult, register_reward
from dare.rewards.formats import CodeFormatReward
from dare.rewards.sandbox import Program, SandboxConfig, default_sandbox


def extract_code(completion: str, language: str = "python") -> str:
    """The first ```` ```python ```` block (DiffuCoder ``extract_code``), else the first fenced block,
    else the text itself with a dangling fence removed (a base model's continuation)."""
    for pattern in (rf"```{language}[ \t]*\n(.*?)```", r"```[a-zA-Z0-9_+-]*[ \t]*\n(.*?)```"):
        blocks = re.findall(pattern, completion, re.DOTALL)
        if blocks:
            return blocks[0]
    opened = re.search(rf"```(?:{language})?[ \t]*\n", completion)
    if opened:  # unterminated block (generation stopped at the length limit)
        return completion[opened.end():]
    return completion.split("```")[0]


def build_program(completion: str, sample: Mapping[str, Any]) -> Program:
    """The program to run: the sample's ``prompt`` + the completion's code (a continuation), or the
    prompt (for its imports) followed by a full definition of ``entry_point``; then ``setup``."""
    code = extract_code(completion)
    prompt = sample.get("prompt") or ""
    entry = sample.get("entry_point")
    defines_entry = bool(entry) and re.search(rf"^(?:async\s+)?def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE)
    if prompt and (defines_entry or code.lstrip().startswith(prompt.strip()[:40])):
        source = prompt + "\n\n" + code if not code.lstrip().startswith(prompt.strip()[:40]) else code
    elif prompt:
        source = prompt + code
    else:
        source = code
    setup = sample.get("setup") or ""
    if setup:
        source = source + "\n\n" + setup
    tests = sample["tests"]
    return Program(source, [tests] if isinstance(tests, str) else list(tests), setup=setup, trusted=trusted_code(prompt),
                   entry_point=entry or None)


def trusted_code(prompt: str) -> str:
    """The sample's ``prompt`` when it is Python on its own (HumanEval's: imports, helper functions, the entry
    point's header with its docstring), run by the test runner so that tests call the task's helpers, not
    the candidate's redefinitions; "" for a prompt that is not (a continuation must complete it)."""
    if not prompt:
        return ""
    try:
        compile(prompt, "task.py", "exec")
    except (SyntaxError, ValueError):
        return ""
    return prompt


@register_reward("code")
class CodeReward(Reward):
    """Options: ``timeout`` (s per program), ``test_timeout`` (s per test), ``require_format``,
    ``workers``, ``memory_mb``, ``backend`` (sandbox backend), ``progress`` (bar over programs)."""

    required_fields = ("tests",)

    def __init__(
        self,
        timeout: float = 20.0,
        test_timeout: float | None = 5.0,
        require_format: bool = False,
        workers: int | None = None,
        memory_mb: int = 2048,
        backend: str = "auto",
        progress: bool = False,
    ):
        self.sandbox = default_sandbox(
            SandboxConfig(timeout=timeout, test_timeout=test_timeout, workers=workers, memory_mb=memory_mb, backend=backend)
        )
        self.require_format = require_format
        self.progress = progress
        self._format = CodeFormatReward()

    def score(self, completions: Sequence[str], samples: Sequence[Mapping[str, Any]]) -> list[RewardResult]:
        self.check(completions, samples)
        run = [i for i, c in enumerate(completions) if not self.require_format or self._format.value(c) >= 1.0]
        programs = [build_program(completions[i], samples[i]) for i in run]
        executed = dict(zip(run, self.sandbox.run_many(programs, progress=self.progress, desc="code tests")))
        code = dict(zip(run, programs))
        results = []
        for i, completion in enumerate(completions):
            if i not in executed:
                results.append(RewardResult(0.0, False, partial=0.0, info={"status": "bad_format"}))
                continue
            ex = executed[i]
            results.append(
                RewardResult(
                    reward=ex.fraction,
                    correct=ex.passed,
                    partial=ex.fraction,
                    extracted=code[i].code,
                    components={"tests": ex.fraction},
                    info=ex.to_dict(),
                )
            )
        return results
