"""Masked-diffusion math as pure tensor functions (no model code).

* :mod:`~dare.diffusion.noise` - per-example random streams (:func:`example_generator`).
* :mod:`~dare.diffusion.forward` - forward processes: per-sequence / per-block ``t``, continuous and
  discrete schedules, Monte-Carlo and stratified corruptions, complementary pairs (:class:`Corruption`).
* :mod:`~dare.diffusion.elbo` - NELBO weights and normalisations, per-example ELBO terms, fp32 log-probs.
"""

from dare.diffusion.elbo import (
    NORMALIZATIONS, nelbo_totals, nelbo_weights, per_example_sum, resolve_normalization, sequence_elbo, token_logprobs,
)
from dare.diffusion.forward import (
    Corruption, ForwardProcess, block_index, corrupt, corrupt_complementary, corrupt_example, corrupt_mc,
    example_spans, exact_mask, iid_mask, stratified_counts, stratified_levels,
)
from dare.diffusion.noise import example_generator, example_seed, sample_t

__all__ = [
    "NORMALIZATIONS", "Corruption", "ForwardProcess", "block_index", "corrupt", "corrupt_complementary",
    "corrupt_example", "corrupt_mc", "example_generator", "example_seed", "example_spans", "exact_mask", "iid_mask",
    "nelbo_totals", "nelbo_weights", "per_example_sum", "resolve_normalization", "sample_t", "sequence_elbo",
    "stratified_counts", "stratified_levels", "token_logprobs",
]
