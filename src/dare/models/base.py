"""Shared base of the native model families: one forward contract for all of them.

``model(input_ids, attention_mask=None, position_ids=None, *, cu_seqlens=None, past_key_values=None,
attn_backend=None, return_hidden=False)`` returns :class:`DiffusionLMOutput` with the raw logits of the
released model (use ``family_of(model).align_logits`` or :meth:`DiffusionLM.denoise` for logits where
position ``i`` predicts token ``i``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn as nn
import torch.utils.checkpoint
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from dare.errors import ConfigError, InputError, check_id_range
from dare.models.attention import (
    AttentionLayout,
    MaskMod,
    attend,
    build_layout,
    check_backend,
    documents_from_cu_seqlens,
)
from dare.models.cache import KVCache, StaticLayerKV
from dare.models.layers import RMSNorm, apply_rope, default_positions, rope_angles
from dare.models.moe import ExpertBank


class DiffusionConfig(PreTrainedConfig):
    """Base of the family configs: keeps every config.json key, validates the ones that matter.

    Subclasses list ``required_keys``; a config.json missing one fails with a one-line error when the
    model is built (configs themselves stay constructible without arguments, as transformers requires).
    """

    required_keys: ClassVar[tuple[str, ...]] = ()

    def validate_for_model(self) -> None:
        missing = [key for key in self.required_keys if getattr(self, key, None) is None]
        if missing:
            raise ConfigError(
                f"{type(self).__name__}: config.json is missing required key(s) {', '.join(missing)}"
            )

    @property
    def embedding_rows(self) -> int:
        """Rows of the token embedding (ids must be smaller)."""
        return self.vocab_size

    def to_diff_dict(self) -> dict:
        # Save every key, like the released config.json files, not only those that differ from defaults.
        return self.to_dict()


def reject_rope_scaling(rope_scaling: dict | None, family: str) -> None:
    """Only plain RoPE is implemented: refuse scaled variants at config construction.

    The value is deliberately not stored as ``rope_scaling``: transformers 5 turns that attribute into
    ``rope_parameters`` and rewrites it.
    """
    if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type", "default")) != "default":
        raise ConfigError(f"{family}: rope_scaling={rope_scaling} is not supported (only plain RoPE)")


@dataclass
class DiffusionLMOutput(ModelOutput):
    """Output of a DARE model forward.

    Attributes:
        logits: ``[B, L, V]`` raw logits (same alignment and dtype as the released model).
        last_hidden_state: ``[B, L, D]`` final normalised hidden states (always returned).
        hidden_states: per-layer inputs plus the final state, when ``output_hidden_states``.
        cache: the :class:`KVCache` passed in, updated.
        sequence_slice: under sequence parallelism, the positions of the (padded) row that ``last_hidden_state`` and
            ``logits`` hold on this rank; None otherwise (they hold every position).
    """

    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    cache: KVCache | None = None
    sequence_slice: slice | None = None


def pad_rows(length: int, input_ids, inputs_embeds, attention_mask, position_ids, cu_seqlens, attention_rule):
    """Pad the inputs of a forward to ``length`` tokens per row with tokens that nothing attends.

    Packed rows (``cu_seqlens``) get a filler document; padded rows extend (or gain) the ``attention_mask`` with
    zeros. Explicit positions are padded with 0; an ``attention_rule`` sees pad positions as the last real one
    (its index tensors cover the real tokens only; the padding / document rules already exclude pad keys).
    Returns the six inputs in the same order.
    """
    rows = input_ids if input_ids is not None else inputs_embeds
    batch, real = rows.shape[:2]
    extra = length - real
    if extra == 0:
        return input_ids, inputs_embeds, attention_mask, position_ids, cu_seqlens, attention_rule
    device = rows.device
    if input_ids is not None:
        input_ids = torch.cat([input_ids, input_ids.new_zeros(batch, extra)], dim=1)
    else:
        inputs_embeds = torch.cat([inputs_embeds, inputs_embeds.new_zeros(batch, extra, inputs_embeds.shape[-1])], 1)
    if cu_seqlens is not None:
        cu_seqlens = torch.cat([cu_seqlens, cu_seqlens.new_tensor([length])])
    if attention_mask is not None or cu_seqlens is None:
        if attention_mask is None:
            attention_mask = torch.ones(batch, real, dtype=torch.long, device=device)
        attention_mask = torch.cat([attention_mask, attention_mask.new_zeros(batch, extra)], dim=1)
    if position_ids is not None:
        position_ids = position_ids.expand(batch, real)
        position_ids = torch.cat([position_ids, position_ids.new_zeros(batch, extra)], dim=1)
    if attention_rule is not None:
        rule, last = attention_rule, real - 1

        def attention_rule(b, h, q, k):
            return rule(b, h, q.clamp(max=last), k.clamp(max=last))

    return input_ids, inputs_embeds, attention_mask, position_ids, cu_seqlens, attention_rule


def rotary_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    layout: AttentionLayout,
    cache: KVCache | None,
    layer,
    backend: str,
    rope_full_precision: bool = False,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """RoPE + cache + attention for ``q [B, L, H, d]`` and ``k, v [B, L, Hkv, d]`` -> ``[B, L, H*d]``.

    ``layer`` is the calling attention module; its ``layer_idx`` picks the cache entry. The index is read only
    inside :func:`cached_attend`, outside compiled code: a compiled block that read it would specialise on it and
    compile once per layer when shapes are static. ``keep`` (query rows ``[Q]``) attends only those queries
    (``layout`` describes them) while every row's keys and values are stored and attended: the output is
    ``[B, Q, H*d]``.
    """
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cos, sin = rope
    q = apply_rope(q, cos, sin, full_precision=rope_full_precision)
    k = apply_rope(k, cos, sin, full_precision=rope_full_precision)
    if keep is not None:
        q = q.index_select(2, keep)
    if isinstance(cache, StaticLayerKV):  # a static step's own layer: written here, inside compiled code
        k, v = cache.store(k, v)
        cache = None
    return cached_attend(q, k, v, layout, cache, layer, backend)


@torch.compiler.disable
def cached_attend(q, k, v, layout: AttentionLayout, cache: KVCache | None, layer, backend: str) -> torch.Tensor:
    """Store/read the KV cache, then :func:`attend` - never traced by ``torch.compile``.

    Compiled blocks (:func:`dare.models.compile.compile_blocks`) stop here: the attention kernels are
    already fused (flash / FlexAttention / varlen), while the layout (document ids, ``max_seqlen``, cached
    masks), the cache and the layer index change between calls and would force recompilations.
    """
    if cache is not None:
        k, v = cache.update(layer.layer_idx, k, v)
    return attend(q, k, v, layout, backend)


def _describe_key(entry) -> str:
    """A loading-info entry as text: a key, or ``key (checkpoint [a, b] vs model [c, d])`` for a shape mismatch."""
    if isinstance(entry, (tuple, list)) and len(entry) == 3:
        key, stored, expected = entry
        return f"{key} (checkpoint {list(stored)} vs model {list(expected)})"
    return str(entry)


GENERATE_NAMES = ("generate", "diffusion_generate")
"""Decoding methods users call out of habit (transformers' ``generate``; ``diffusion_generate`` of the released Dream
remote code; LLaDA2's ``generate``): DARE's models have none, they decode through :mod:`dare.rollout` samplers."""


def generate_hint(cls_name: str, name: str) -> str:
    """The AttributeError message for ``model.<name>`` (one of :data:`GENERATE_NAMES`)."""
    return (f"'{cls_name}' object has no attribute '{name}': DARE's models decode with a sampler: "
            f"dare.rollout.generate(model, input_ids, attention_mask, SamplerConfig(...)) (an unset sampler is the "
            f"family's default; the released remote code's steps, gen_length, block_length, temperature, top_p and "
            f"top_k are SamplerConfig fields of the same names, Dream's alg is its confidence), or on the command "
            f"line `dare generate --model ...`")


class DiffusionLM(PreTrainedModel):
    """Base class of the family models.

    Subclasses build their modules under the released parameter names and implement
    :meth:`embed`, :attr:`blocks`, :meth:`final_norm`, :meth:`head` and the RoPE properties; each block is
    called as ``block(x, rope, layout, cache, backend)``.
    """

    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True

    def __init__(self, config: DiffusionConfig):
        from dare.models.spec import family_of, validate_token_ids

        config.validate_for_model()
        family = family_of(config)
        validate_token_ids(family.token_ids(config), config.embedding_rows, family.name)
        super().__init__(config)
        self.vocab_size = config.embedding_rows
        self.gradient_checkpointing = False
        self.attn_backend = "sdpa"

    def __getattr__(self, name: str):
        """nn.Module's lookup of parameters and submodules; a missing ``generate`` / ``diffusion_generate`` (what
        transformers' models and the released Dream / LLaDA2 remote code offer) is still an AttributeError, so
        ``hasattr`` stays False for libraries that probe it, but its message says how these models decode."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in GENERATE_NAMES:
                raise AttributeError(generate_hint(type(self).__name__, name)) from None
            raise

    # ---- family hooks -------------------------------------------------------------------------
    @property
    def blocks(self) -> nn.ModuleList:
        raise NotImplementedError

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def head(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    rope_dim: int  # rotary width per head (partial rotary < head_dim)
    rope_theta: float

    def layout_rules(self, query_positions: torch.Tensor, key_positions: torch.Tensor, block_size: int | None) -> dict:
        """The family's attention topology as :func:`build_layout` rules.

        Full-attention families add nothing. Block-causal families (``spec.attention == "block_causal"``)
        put token ``i`` in block ``position_i // block_size`` - the grid is anchored at position 0, as in the
        reference samplers - and let a query see keys of its own and earlier blocks. Cached keys keep their
        own positions (:attr:`KVCache.positions`).
        """
        if self.family.attention != "block_causal":
            return {}
        return {"q_block": query_positions // block_size, "k_block": key_positions // block_size}

    @property
    def block_size(self) -> int | None:
        """Default block length of block-causal families: ``config.block_size`` if set, else the family's."""
        return getattr(self.config, "block_size", None) or self.family.block_size

    # ---- shared machinery ---------------------------------------------------------------------
    @property
    def family(self):
        from dare.models.spec import family_of

        return family_of(self.config)

    @property
    def token_ids(self):
        return self.family.token_ids(self.config)

    def _init_weights(self, module: nn.Module) -> None:
        std = getattr(self.config, "initializer_range", None) or getattr(self.config, "init_std", None) or 0.02
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, ExpertBank):
            module.reset_parameters(std)
        for name, buffer in module.named_buffers(recurse=False):
            if name.endswith("expert_bias"):
                nn.init.zeros_(buffer)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None) -> None:
        """Recompute each block in the backward pass (non-reentrant checkpointing)."""
        self.gradient_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        self.gradient_checkpointing = False

    @property
    def is_gradient_checkpointing(self) -> bool:
        return self.gradient_checkpointing

    def can_generate(self) -> bool:  # diffusion decoding lives in dare.rollout, not HF generate()
        return False

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' ``from_pretrained`` with strict parameter names.

        Any missing, unexpected or mis-shaped tensor is an error naming the first few keys, instead of a
        warning followed by a silently random-initialised model. With tied embeddings the checkpoint may omit
        the tied copy (``lm_head.weight``) or contain it with the same values; different values are an error.
        """
        wants_info = kwargs.pop("output_loading_info", False)
        kwargs.setdefault("ignore_mismatched_sizes", True)  # reported below as a one-line error, never kept
        try:
            model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True,
                                                  **kwargs)
        except RuntimeError as err:  # transformers' weight conversion: per-expert tensors that cannot be stacked
            if "conversion of the weights" not in str(err):
                raise
            raise ConfigError(f"checkpoint {pretrained_model_name_or_path} does not match {cls.__name__}: the "
                              "per-expert tensors (experts.N.*) are incomplete or mis-shaped") from None
        problems = []
        for label in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            keys = sorted(_describe_key(k) for k in (info.get(label) or []))
            if keys:
                shown = ", ".join(keys[:3]) + (f" (+{len(keys) - 3} more)" if len(keys) > 3 else "")
                problems.append(f"{label.replace('_', ' ')}: {shown}")
        for target, source in model.get_expanded_tied_weights_keys(all_submodels=True).items():
            if model.get_parameter(target) is not model.get_parameter(source):  # transformers only warns
                problems.append(f"{target} differs from {source} although the config ties them")
        if problems:
            raise ConfigError(
                f"checkpoint {pretrained_model_name_or_path} does not match {cls.__name__}: {'; '.join(problems)}"
            )
        return (model, info) if wants_info else model

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        *,
        cu_seqlens: torch.Tensor | None = None,
        attn_backend: str | None = None,
        block_size: int | None = None,
        attention_rule: MaskMod | None = None,
        return_hidden: bool = False,
        logits_positions: slice | None = None,
        sequence_parallel=None,
        output_hidden_states: bool = False,
        return_dict: bool = True,
        use_cache: bool | None = None,
        labels: torch.Tensor | None = None,
        **unused,
    ) -> DiffusionLMOutput:
        """Run the denoiser.

        Args:
            input_ids: ``[B, L]`` token ids (mask tokens included); or pass ``inputs_embeds [B, L, D]``.
            attention_mask: ``[B, K]`` padding mask over all keys (cached + current), 1 = real token.
                Padding is never attended (bidirectional attention makes this matter on both sides).
            position_ids: ``[B, L]`` RoPE positions; default counts real tokens (packed documents restart at 0).
                Required with a KV cache.
            cache: a :class:`KVCache` (see its modes); ``past_key_values=`` is accepted as an alias.
            cu_seqlens: cumulative document lengths of a packed ``[1, total]`` row; documents never attend to
                each other.
            attn_backend: ``sdpa`` (default), ``eager``, ``flex`` or ``varlen``.
            block_size: block length of a block-causal family for this call (default :attr:`block_size`).
            attention_rule: a FlexAttention ``mask_mod(b, h, q, k) -> bool`` over this call's queries and all
                attended keys (cached + current) that *replaces* the family's topology (full / block-causal);
                padding (``attention_mask``) and packing (``cu_seqlens``) still apply. Used for the ``[noisy ;
                clean]`` block-diffusion training layout (:mod:`dare.models.block_diffusion`).
            return_hidden: skip the LM head (``logits=None``), e.g. for a chunked loss.
            logits_positions: apply the LM head only to ``[:, logits_positions]`` (e.g. ``slice(0, n)``, the noisy
                half of the ``[noisy ; clean]`` layout, which halves the logits memory); ``last_hidden_state`` keeps
                every position.
            sequence_parallel: a :class:`dare.distributed.sequence.SequenceParallel` (training forwards under
                ``distributed.sequence_parallel``): rows are padded to a multiple of the degree (padding is never
                attended), this rank runs its own slice of the positions (``sequence_slice`` of the output) through
                the token-wise layers and exchanges heads around attention, which stays exact over the whole row.
                ``last_hidden_state`` / ``logits`` hold that slice only; every rank of the group must make the same
                call. No KV cache, no ``logits_positions``.
        """
        if labels is not None:
            raise InputError("DARE models do not compute a loss in forward(); use dare.diffusion objectives")
        if unused.get("output_attentions"):
            raise InputError("output_attentions is not supported")
        if (input_ids is None) == (inputs_embeds is None):
            raise InputError("pass exactly one of input_ids or inputs_embeds")
        backend = check_backend(attn_backend or self.attn_backend)
        if input_ids is not None:
            if input_ids.ndim != 2:
                raise InputError(f"input_ids must be [batch, length]; got shape {list(input_ids.shape)}")
            check_id_range(input_ids, self.vocab_size, "input_ids")
        window = slice(None)  # this rank's positions (all of them without sequence parallelism)
        if sequence_parallel is not None:
            if cache is not None or unused.get("past_key_values") is not None:
                raise InputError("sequence parallelism shards training forwards; it cannot be combined with a KV cache")
            if logits_positions is not None:
                raise InputError("logits_positions cannot be combined with sequence parallelism "
                                 "(each rank returns the outputs of its own positions)")
            real = (input_ids if input_ids is not None else inputs_embeds).shape[1]
            input_ids, inputs_embeds, attention_mask, position_ids, cu_seqlens, attention_rule = pad_rows(
                sequence_parallel.padded_length(real), input_ids, inputs_embeds, attention_mask, position_ids,
                cu_seqlens, attention_rule)
        rows = input_ids if input_ids is not None else inputs_embeds
        batch, length = rows.shape[:2]
        device = rows.device
        if sequence_parallel is not None:
            window = sequence_parallel.shard(length)
        x = self.embed(input_ids[:, window]) if input_ids is not None else inputs_embeds[:, window]

        if cache is None:
            cache = unused.pop("past_key_values", None)
        if cache is not None:
            if position_ids is None:
                raise InputError("position_ids are required when decoding with a KV cache")
            kv_len = cache.seq_len if cache.mode == "replace" else cache.seq_len + length
        else:
            kv_len = length
        doc_positions = None
        if cu_seqlens is not None:
            _, doc_positions = documents_from_cu_seqlens(cu_seqlens.to(device), length)
        if position_ids is None:
            position_ids = default_positions(batch, length, device, attention_mask, doc_positions)
        elif tuple(position_ids.shape) != (batch, length):
            position_ids = position_ids.expand(batch, length)
        position_ids = position_ids.to(device)
        key_positions = position_ids if cache is None else cache.key_positions(position_ids)
        if attention_rule is not None:
            if block_size is not None:
                raise InputError("pass block_size or attention_rule, not both (the rule defines the blocks)")
            rules = {"extra": attention_rule}
        else:
            rules = self.layout_rules(position_ids, key_positions, self._resolve_block_size(block_size))
        layout = build_layout(
            batch, length, kv_len, device, attention_mask=attention_mask, cu_seqlens=cu_seqlens, **rules
        )
        if cache is not None:
            cache.store_positions(key_positions)
        rope = rope_angles(position_ids[:, window], self.rope_dim, self.rope_theta)
        layout.sequence = sequence_parallel

        all_hidden = [] if output_hidden_states else None
        checkpointing = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            if all_hidden is not None:
                all_hidden.append(x)
            if checkpointing:
                x = torch.utils.checkpoint.checkpoint(block, x, rope, layout, cache, backend, use_reentrant=False)
            else:
                x = block(x, rope, layout, cache, backend)
        x = self.final_norm(x)
        if all_hidden is not None:
            all_hidden.append(x)
        logits = None if return_hidden else self.head(x if logits_positions is None else x[:, logits_positions])
        return DiffusionLMOutput(
            logits=logits,
            last_hidden_state=x,
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
            cache=cache,
            sequence_slice=None if sequence_parallel is None else window,
        )

    def _resolve_block_size(self, block_size: int | None) -> int | None:
        if self.family.attention != "block_causal":
            if block_size is not None:
                raise InputError(f"block_size applies to block-causal families; {self.family.name} uses full attention")
            return None
        block_size = self.block_size if block_size is None else block_size
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise InputError(f"block_size must be a positive integer; got {block_size!r}")
        return block_size

    def denoise(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        """Logits aligned so that position ``i`` predicts token ``i`` (applies the family's shift)."""
        out = self(input_ids, **kwargs)
        return self.family.align_logits(out.logits, kwargs.get("cu_seqlens"))
