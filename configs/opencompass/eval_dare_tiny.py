"""OpenCompass smoke test of the DARE plug-in: a tiny random LLaDA on CPU, two small custom datasets.

Run from the repository root in an environment with OpenCompass and DARE installed::

    dare eval opencompass configs/opencompass/eval_dare_tiny.py -w outputs/opencompass_tiny   # or: opencompass ...

``tiny_mcq`` is scored by likelihood (OpenCompass ``ppl`` inferencer -> ``get_ppl`` -> MC-ELBO), ``tiny_qa``
by generation (``gen`` inferencer -> ``generate`` with the Fast-dLLM sampler). Accuracies of a random model
are meaningless; the run checks the wiring.
"""

from dare.eval.opencompass import DareDiffusionModel

models = [
    dict(
        type=DareDiffusionModel,
        abbr="tiny-llada-fastdllm",
        path="tiny:llada",
        sampler=dict(sampler="fastdllm", block_length=8),
        likelihood=dict(mc_samples=4),
        dtype="float32",
        device="cpu",
        max_seq_len=512,
        max_out_len=16,
        batch_size=4,
        run_cfg=dict(num_gpus=0),
    )
]

datasets = [
    dict(path="configs/opencompass/data/tiny_mcq.jsonl", data_type="mcq", infer_method="ppl"),
    dict(path="configs/opencompass/data/tiny_qa.jsonl", data_type="qa", infer_method="gen"),
]
