"""LLaDA2.0 / LLaDA2.1 (inclusionAI/LLaDA2.0-mini/-flash, LLaDA2.1-mini/-flash): block diffusion MoE (Ling-2.0).

Parameter names follow the released checkpoint: ``model.word_embeddings``, ``model.layers.N.attention.
{query_key_value, query_layernorm, key_layernorm, dense}``, ``model.layers.N.mlp.*``, ``model.norm``, ``lm_head``.

* Fused ``query_key_value``: its output viewed as ``[H + 2 Hkv, head_dim]`` rows holds the H query heads, then
  the Hkv key heads, then the Hkv value heads; q and k get per-head RMSNorm, then partial RoPE
  (``partial_rotary_factor`` 0.5: the first half of each head rotates, with frequencies over that width).
* The first ``first_k_dense_replace`` layers use a dense SwiGLU; the others a MoE with group-limited sigmoid
  routing: ``s = sigmoid(x W^T)`` in fp32; experts are *selected* on ``s + gate.expert_bias`` (the best
  ``topk_group`` of ``n_group`` groups, a group scored by the sum of its two best experts, then the top-k
  experts inside them) but *weighted* by the unbiased ``s``, normalised to sum 1 and scaled by
  ``routed_scaling_factor``; expert outputs are combined in fp32; shared experts are added.
* Logits are returned in fp32 (the reference upcasts them).

Attention is block-causal with block 32 by default (``model(..., block_size=16)`` for other lengths).
LLaDA2.1 has the same architecture; its token editing is a sampler concern.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dare.errors import ConfigError
from dare.models.base import DiffusionConfig, reject_rope_scaling, rotary_attention
from dare.models.decoder import DecoderLayer, DecoderLM
from dare.models.fusion import project_one
from dare.models.layers import RMSNorm, SwiGLU
from dare.models.moe import ExpertBank, register_expert_checkpoint_names
from dare.models.spec import FamilySpec, register_family


class LLaDA2MoeConfig(DiffusionConfig):
    """LLaDA2 MoE config with the released ``config.json`` keys (``model_type: "llada2_moe"``)."""

    model_type = "llada2_moe"
    required_keys = (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "vocab_size", "rope_theta", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "n_group",
        "topk_group",
    )

    def __init__(
        self,
        vocab_size: int | None = None,
        hidden_size: int | None = None,
        intermediate_size: int | None = None,
        num_hidden_layers: int | None = None,
        num_attention_heads: int | None = None,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        use_qkv_bias: bool = False,
        use_bias: bool = False,
        use_qk_norm: bool = True,
        rms_norm_eps: float = 1e-6,
        rope_theta: float | None = None,
        partial_rotary_factor: float = 0.5,
        rope_scaling: dict | None = None,
        max_position_embeddings: int = 32768,
        num_experts: int | None = None,
        num_shared_experts: int | None = None,
        num_experts_per_tok: int | None = None,
        moe_intermediate_size: int | None = None,
        first_k_dense_replace: int = 0,
        n_group: int | None = None,
        topk_group: int | None = None,
        routed_scaling_factor: float = 2.5,
        score_function: str = "sigmoid",
        norm_topk_prob: bool = True,
        moe_router_enable_expert_bias: bool = True,
        attention_dropout: float = 0.0,
        initializer_range: float = 0.02,
        tie_word_embeddings: bool = False,
        block_size: int | None = None,
        mask_token_id: int | None = None,
        pad_token_id: int | None = None,
        eos_token_id: int | None = None,
        use_cache: bool = False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or None  # the reference constructor's default is 0
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.use_qkv_bias = use_qkv_bias
        self.use_bias = use_bias
        self.use_qk_norm = use_qk_norm
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.partial_rotary_factor = partial_rotary_factor
        reject_rope_scaling(rope_scaling, "LLaDA2")
        self.max_position_embeddings = max_position_embeddings
        self.num_experts = num_experts
        self.num_shared_experts = num_shared_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.moe_intermediate_size = moe_intermediate_size
        self.first_k_dense_replace = first_k_dense_replace
        self.n_group = n_group
        self.topk_group = topk_group
        self.routed_scaling_factor = routed_scaling_factor
        self.score_function = score_function
        self.norm_topk_prob = norm_topk_prob
        self.moe_router_enable_expert_bias = moe_router_enable_expert_bias
        self.attention_dropout = attention_dropout
        self.initializer_range = initializer_range
        self.tie_word_embeddings = tie_word_embeddings
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.use_cache = use_cache
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id, **kwargs)

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rotary_width(self) -> int:
        """Rotated channels per head: ``int(head_dim * partial_rotary_factor)`` (64 of 128 for the releases)."""
        return int(self.attention_head_dim * self.partial_rotary_factor)

    def validate_for_model(self) -> None:
        super().validate_for_model()

        def require(ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(f"LLaDA2: {message}")

        require(self.hidden_act == "silu", f"hidden_act={self.hidden_act!r} is not supported (expected 'silu')")
        require(not self.attention_dropout, "attention_dropout must be 0")
        require(
            self.score_function == "sigmoid", f"score_function={self.score_function!r} is not supported (expected 'sigmoid')"
        )
        require(bool(self.norm_topk_prob), "norm_topk_prob=false is not supported (the reference always normalises)")
        require(bool(self.use_qk_norm), "use_qk_norm=false is not supported (the reference always normalises q and k)")
        require(
            self.num_attention_heads % self.num_key_value_heads == 0,
            f"num_attention_heads={self.num_attention_heads} is not a multiple of "
            f"num_key_value_heads={self.num_key_value_heads}",
        )
        require(
            0 < self.partial_rotary_factor <= 1 and self.rotary_width > 0 and self.rotary_width % 2 == 0,
            f"partial_rotary_factor={self.partial_rotary_factor} must give an even rotary width in (0, head_dim]",
        )
        rotary_dim = getattr(self, "rotary_dim", None)
        require(
            rotary_dim in (None, self.rotary_width),
            f"rotary_dim={rotary_dim} disagrees with head_dim * partial_rotary_factor = {self.rotary_width}",
        )
        require(
            self.n_group > 0 and self.num_experts % self.n_group == 0 and self.num_experts // self.n_group >= 2,
            f"num_experts={self.num_experts} must split into n_group={self.n_group} groups of at least 2 experts",
        )
        require(0 < self.topk_group <= self.n_group, f"topk_group={self.topk_group} must be in [1, n_group={self.n_group}]")
        require(
            0 < self.num_experts_per_tok <= self.topk_group * (self.num_experts // self.n_group),
            f"num_experts_per_tok={self.num_experts_per_tok} must be in [1, experts of the {self.topk_group} kept groups]",
        )
        require(
            self.block_size is None or (isinstance(self.block_size, int) and self.block_size >= 1),
            f"block_size={self.block_size!r} must be a positive integer",
        )


class FusedQKVAttention(nn.Module):
    """``query_key_value`` -> per-head ``query_layernorm``/``key_layernorm`` -> partial RoPE -> attention -> ``dense``."""

    fused_groups = {"qkv": ("query_key_value",), "dense": ("dense",)}  # groups of one: FP8 decoding copies them

    def __init__(self, config: LLaDA2MoeConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.attention_head_dim
        rows = (self.n_heads + 2 * self.n_kv) * self.head_dim
        self.query_key_value = nn.Linear(config.hidden_size, rows, bias=config.use_qkv_bias)
        self.query_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.key_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.dense = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=config.use_bias)

    def forward(self, x, rope, layout, cache, backend, keep=None):
        b, length, _ = x.shape
        qkv = project_one(self, "qkv", x).view(b, length, self.n_heads + 2 * self.n_kv, self.head_dim)
        q, k, v = qkv.split([self.n_heads, self.n_kv, self.n_kv], dim=2)
        q, k = self.query_layernorm(q), self.key_layernorm(k)
        return project_one(self, "dense", rotary_attention(q, k, v, rope, layout, cache, self, backend, keep=keep))


class GroupLimitedRouter(nn.Linear):
    """``gate.weight [E, D]`` and the persistent ``gate.expert_bias [E]`` buffer of the LLaDA2 router."""

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__(config.hidden_size, config.num_experts, bias=False)
        self.top_k, self.n_group, self.topk_group = config.num_experts_per_tok, config.n_group, config.topk_group
        self.scale = config.routed_scaling_factor
        self.register_buffer("expert_bias", torch.zeros(config.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [T, D]`` -> chosen experts ``[T, k]`` and their fp32 weights ``[T, k]``."""
        scores = torch.sigmoid(nn.functional.linear(x.float(), self.weight.float()))
        biased = scores + self.expert_bias.float()
        tokens = biased.shape[0]
        grouped = biased.view(tokens, self.n_group, -1)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)
        kept_groups = group_scores.topk(self.topk_group, dim=-1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept_groups, True)
        candidates = grouped.masked_fill(~keep[..., None], float("-inf")).view(tokens, -1)
        chosen = candidates.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, chosen)
        if self.top_k > 1:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return chosen, weights * self.scale


class GroupLimitedMoE(nn.Module):
    """``gate`` (:class:`GroupLimitedRouter`), ``experts`` (stacked :class:`~dare.models.moe.ExpertBank`, released
    as ``experts.N``) and optional ``shared_experts`` (SwiGLU). Routed outputs are weighted and summed in fp32."""

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__()
        self.gate = GroupLimitedRouter(config)
        self.experts = ExpertBank(config.num_experts, config.hidden_size, config.moe_intermediate_size)
        if config.num_shared_experts:
            self.shared_experts = SwiGLU(config.hidden_size, config.moe_intermediate_size * config.num_shared_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        chosen, weights = self.gate(flat)
        out = (self.experts(flat, chosen).float() * weights[..., None]).sum(dim=1)
        out = out.to(x.dtype).reshape(shape)
        if hasattr(self, "shared_experts"):
            out = out + self.shared_experts(x)
        return out


class LLaDA2MoeModelLM(DecoderLM):
    """LLaDA2.0 / LLaDA2.1 block-diffusion MoE (``architectures: ["LLaDA2MoeModelLM"]``); logits in fp32."""

    config_class = LLaDA2MoeConfig
    embedding_name = "word_embeddings"
    _tied_weights_keys = {"lm_head.weight": "model.word_embeddings.weight"}
    _no_split_modules = ["DecoderLayer"]

    @staticmethod
    def rotary_dim(config: LLaDA2MoeConfig) -> int:
        return config.rotary_width

    @staticmethod
    def build_layers(config: LLaDA2MoeConfig) -> list:
        layers = []
        for i in range(config.num_hidden_layers):
            if i < config.first_k_dense_replace:
                mlp = SwiGLU(config.hidden_size, config.intermediate_size)
            else:
                mlp = GroupLimitedMoE(config)
            layers.append(
                DecoderLayer(config.hidden_size, config.rms_norm_eps, FusedQKVAttention(config, i), mlp,
                             attention_name="attention")
            )
        return layers

    def head(self, x):
        return self.lm_head(x).float()


register_expert_checkpoint_names(LLaDA2MoeModelLM)


def tiny_llada2_config(vocab_size: int = 264, mask_token_id: int = 259, eos_token_id: int = 258,
                       pad_token_id: int = 256, **overrides) -> dict:
    """config.json of a tiny LLaDA2 (layer 0 dense, layer 1 MoE: 8 experts in 2 groups, top-2; models.md 6.4)."""
    config = dict(
        model_type="llada2_moe", architectures=["LLaDA2MoeModelLM"], vocab_size=vocab_size, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        hidden_act="silu", use_qkv_bias=False, use_bias=False, use_qk_norm=True, use_rmsnorm=True, norm_head=False,
        norm_softmax=False, rms_norm_eps=1e-6, rope_theta=600000, partial_rotary_factor=0.5, rotary_dim=8,
        rope_scaling=None, max_position_embeddings=512, num_experts=8, num_shared_experts=1, num_experts_per_tok=2,
        moe_intermediate_size=32, first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5,
        score_function="sigmoid", norm_topk_prob=True, moe_router_enable_expert_bias=True, router_dtype="fp32",
        output_router_logits=False, attention_dropout=0.0, embedding_dropout=0.0, output_dropout=0.0,
        initializer_range=0.02, tie_word_embeddings=False, use_sliding_window=False, sliding_window=4096,
        max_window_layers=2, mask_token_id=mask_token_id, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
        use_cache=False,
    )
    config.update(overrides)
    return config


LLADA2 = register_family(
    FamilySpec(
        name="llada2",
        description="LLaDA2.0/2.1-mini/-flash: block diffusion mixture of experts, block-causal attention",
        config_class=LLaDA2MoeConfig,
        model_class=LLaDA2MoeModelLM,
        attention="block_causal",
        logit_shift=0,
        block_size=32,
        mask_token_id=156895,
        eos_token_id=156892,
        pad_token_id=156892,
        lora_targets=r".*\.layers\.\d+\.attention\.(query_key_value|dense)",
        tiny_config=tiny_llada2_config,
    )
)
