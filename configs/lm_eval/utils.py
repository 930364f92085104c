"""Scoring hooks of the tiny lm-eval tasks in this directory (lm-eval loads them with ``!function utils.NAME``)."""


def gsm8k_accuracy(doc: dict, results: list[str]) -> dict[str, float]:
    """DARE's GSM8K scorer on one completion: the same answer extraction and comparison as ``dare eval run``."""
    from dare.eval import get_benchmark

    bench = get_benchmark("gsm8k")
    result = bench.score([results[0]], [bench.parse_row(doc, 0)])[0]
    return {"accuracy": float(result.correct)}
