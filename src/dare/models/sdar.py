"""SDAR (JetLM/SDAR-1.7B/4B/8B-Chat, SDAR-30B-A3B-Chat) and TraDo (Gen-Verse/TraDo-4B/8B): block diffusion on Qwen3.

Qwen3 layout (``model.embed_tokens / layers.N.{self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp} / norm`` +
``lm_head``): per-head q/k RMSNorm, GQA, RoPE theta 1e6, SwiGLU, no attention bias. Heads are sized by
``head_dim``, which may differ from ``hidden_size / num_attention_heads`` (SDAR-4B: 128 vs 80).

Attention is block-causal (``spec.attention == "block_causal"``): token ``i`` sees token ``j`` iff
``pos_j // block_size <= pos_i // block_size``; the block length comes from ``config.block_size`` (released
dense configs carry 4) or the family default 4, and can be changed per call (``model(..., block_size=8)``).

Two families share this module:

* ``sdar`` - dense, ``model_type: "sdar"``, ``architectures: ["SDARForCausalLM"]``. Tied embeddings are
  supported; the checkpoint may or may not contain ``lm_head.weight``.
* ``sdar_moe`` - ``model_type: "sdar_moe"`` (as in the released SDAR-30B-A3B config),
  ``architectures: ["SDARMoeForCausalLM"]``: Qwen3-MoE routing (softmax in fp32, top-k, renormalised when
  ``norm_topk_prob``); layers listed in ``mlp_only_layers`` or off the ``decoder_sparse_step`` grid are dense.

``fuse_cross_entropy`` is kept as a config key (the reference reads it to skip the logits in training); DARE's
losses use ``model(..., return_hidden=True)`` and ``model.head`` instead.
"""

from __future__ import annotations

from dare.errors import ConfigError
from dare.models.base import DiffusionConfig, reject_rope_scaling
from dare.models.decoder import DecoderLayer, DecoderLM, SelfAttention, SoftmaxTopKMoE
from dare.models.layers import SwiGLU
from dare.models.moe import register_expert_checkpoint_names
from dare.models.spec import FamilySpec, register_family


class _Qwen3StyleConfig(DiffusionConfig):
    """Keys shared by the SDAR dense and MoE configs (Qwen3 names)."""

    family_label = "SDAR"

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
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        rope_theta: float | None = None,
        rope_scaling: dict | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        use_sliding_window: bool = False,
        sliding_window: int | None = None,
        max_window_layers: int | None = None,
        tie_word_embeddings: bool = False,
        block_size: int | None = None,
        mask_token_id: int | None = None,
        pad_token_id: int | None = None,
        eos_token_id: int | None = None,
        bos_token_id: int | None = None,
        use_cache: bool = False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads if num_key_value_heads is not None else num_attention_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        reject_rope_scaling(rope_scaling, self.family_label)
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window
        self.max_window_layers = max_window_layers
        self.tie_word_embeddings = tie_word_embeddings
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.use_cache = use_cache
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id, **kwargs)

    @property
    def attention_head_dim(self) -> int:
        """``head_dim`` when given (it may differ from hidden / heads), else ``hidden_size // num_attention_heads``."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def validate_for_model(self) -> None:
        super().validate_for_model()
        name = self.family_label
        if self.hidden_act != "silu":
            raise ConfigError(f"{name}: hidden_act={self.hidden_act!r} is not supported (expected 'silu')")
        if self.attention_dropout:
            raise ConfigError(f"{name}: attention_dropout must be 0")
        if self.use_sliding_window:
            raise ConfigError(f"{name}: use_sliding_window=true is not supported (released checkpoints use none)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"{name}: num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.attention_head_dim % 2:
            raise ConfigError(f"{name}: head_dim={self.attention_head_dim} must be even for RoPE")
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size < 1):
            raise ConfigError(f"{name}: block_size={self.block_size!r} must be a positive integer")


class SDARConfig(_Qwen3StyleConfig):
    """SDAR / TraDo dense config with the released ``config.json`` keys (``model_type: "sdar"``)."""

    model_type = "sdar"
    required_keys = (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "rope_theta",
    )

    def __init__(self, fuse_cross_entropy: bool = False, **kwargs):
        self.fuse_cross_entropy = fuse_cross_entropy
        super().__init__(**kwargs)


class SDARMoeConfig(_Qwen3StyleConfig):
    """SDAR-MoE config (``model_type: "sdar_moe"``, Qwen3-MoE keys)."""

    model_type = "sdar_moe"
    family_label = "SDAR-MoE"
    required_keys = (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "rope_theta", "num_experts",
        "num_experts_per_tok", "moe_intermediate_size",
    )

    def __init__(
        self,
        num_experts: int | None = None,
        num_experts_per_tok: int | None = None,
        moe_intermediate_size: int | None = None,
        decoder_sparse_step: int = 1,
        mlp_only_layers: list[int] | None = None,
        norm_topk_prob: bool = False,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        **kwargs,
    ):
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.moe_intermediate_size = moe_intermediate_size
        self.decoder_sparse_step = decoder_sparse_step
        self.mlp_only_layers = list(mlp_only_layers or [])
        self.norm_topk_prob = norm_topk_prob
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        super().__init__(**kwargs)

    @property
    def moe_layers(self) -> list[bool]:
        """Whether each layer is sparse (Qwen3-MoE rule: not in ``mlp_only_layers`` and on the sparse-step grid)."""
        return [
            i not in self.mlp_only_layers and self.num_experts > 0 and (i + 1) % self.decoder_sparse_step == 0
            for i in range(self.num_hidden_layers)
        ]

    def validate_for_model(self) -> None:
        super().validate_for_model()
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ConfigError(
                f"SDAR-MoE: num_experts_per_tok={self.num_experts_per_tok} must be in [1, num_experts={self.num_experts}]"
            )
        if self.decoder_sparse_step < 1:
            raise ConfigError(f"SDAR-MoE: decoder_sparse_step={self.decoder_sparse_step} must be >= 1")
        if not all(self.moe_layers) and not self.intermediate_size:
            raise ConfigError("SDAR-MoE: dense layers (mlp_only_layers / decoder_sparse_step) need intermediate_size")


def _attention(config: _Qwen3StyleConfig, layer_idx: int) -> SelfAttention:
    return SelfAttention(
        config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.attention_head_dim,
        layer_idx, qkv_bias=config.attention_bias, o_bias=config.attention_bias, qk_norm_eps=config.rms_norm_eps,
    )


class _SDARBase(DecoderLM):
    _no_split_modules = ["DecoderLayer"]
    rmsnorm_scale_in_fp32 = True  # the reference's fused triton RMSNorm (rms_norm_fn): weight multiplied in fp32

    @staticmethod
    def rotary_dim(config: _Qwen3StyleConfig) -> int:
        return config.attention_head_dim


class SDARForCausalLM(_SDARBase):
    """SDAR / TraDo dense block-diffusion LM (``architectures: ["SDARForCausalLM"]``)."""

    config_class = SDARConfig

    @staticmethod
    def build_layers(config: SDARConfig) -> list:
        return [
            DecoderLayer(
                config.hidden_size, config.rms_norm_eps, _attention(config, i),
                SwiGLU(config.hidden_size, config.intermediate_size),
            )
            for i in range(config.num_hidden_layers)
        ]


class SDARMoeForCausalLM(_SDARBase):
    """SDAR-MoE block-diffusion LM (``architectures: ["SDARMoeForCausalLM"]``)."""

    config_class = SDARMoeConfig

    @staticmethod
    def build_layers(config: SDARMoeConfig) -> list:
        layers = []
        for i, sparse in enumerate(config.moe_layers):
            if sparse:
                mlp = SoftmaxTopKMoE(
                    config.hidden_size, config.moe_intermediate_size, config.num_experts, config.num_experts_per_tok,
                    normalize=config.norm_topk_prob, expert_bias=False,
                )
            else:
                mlp = SwiGLU(config.hidden_size, config.intermediate_size)
            layers.append(DecoderLayer(config.hidden_size, config.rms_norm_eps, _attention(config, i), mlp))
        return layers


register_expert_checkpoint_names(SDARMoeForCausalLM)


def tiny_sdar_config(vocab_size: int = 264, mask_token_id: int = 259, eos_token_id: int = 258,
                     pad_token_id: int = 256, **overrides) -> dict:
    """config.json of a tiny SDAR (2 layers, hidden 64, GQA 4:2, head_dim 16, block 4; models.md 5.4).

    Variants through overrides: ``head_dim=32`` (q_proj out 128 != hidden 64, like SDAR-4B) and
    ``tie_word_embeddings=True``.
    """
    config = dict(
        model_type="sdar", architectures=["SDARForCausalLM"], vocab_size=vocab_size, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        hidden_act="silu", max_position_embeddings=512, rope_theta=1000000.0, rope_scaling=None, rms_norm_eps=1e-6,
        attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False, use_sliding_window=False,
        sliding_window=None, max_window_layers=2, fuse_cross_entropy=False, block_size=4, initializer_range=0.02,
        mask_token_id=mask_token_id, pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=257,
        use_cache=False,
    )
    config.update(overrides)
    return config


def tiny_sdar_moe_config(vocab_size: int = 264, mask_token_id: int = 259, eos_token_id: int = 258,
                         pad_token_id: int = 256, **overrides) -> dict:
    """config.json of a tiny SDAR-MoE (layer 0 dense via ``mlp_only_layers``, layer 1 with 8 experts, top-2)."""
    config = tiny_sdar_config(vocab_size, mask_token_id, eos_token_id, pad_token_id)
    for key in ("fuse_cross_entropy", "block_size"):  # absent from the released SDAR-30B-A3B config
        config.pop(key)
    config.update(
        model_type="sdar_moe", architectures=["SDARMoeForCausalLM"], num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[0], norm_topk_prob=True,
        output_router_logits=False, router_aux_loss_coef=0.001,
    )
    config.update(overrides)
    return config


_QWEN3_TOKENS = dict(mask_token_id=151669, eos_token_id=151643, pad_token_id=151643, eot_token_id=151645)

SDAR = register_family(
    FamilySpec(
        name="sdar",
        description="SDAR-1.7B/4B/8B, TraDo-4B/8B: block diffusion from Qwen3, block-causal attention",
        config_class=SDARConfig,
        model_class=SDARForCausalLM,
        attention="block_causal",
        logit_shift=0,
        block_size=4,
        lora_targets=r".*\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj))",
        tiny_config=tiny_sdar_config,
        **_QWEN3_TOKENS,
    )
)

SDAR_MOE = register_family(
    FamilySpec(
        name="sdar_moe",
        description="SDAR-30B-A3B: block diffusion mixture of experts from Qwen3-MoE, block-causal attention",
        config_class=SDARMoeConfig,
        model_class=SDARMoeForCausalLM,
        attention="block_causal",
        logit_shift=0,
        block_size=4,
        lora_targets=r".*\.layers\.\d+\.self_attn\.(q_proj|k_proj|v_proj|o_proj)",
        tiny_config=tiny_sdar_moe_config,
        **_QWEN3_TOKENS,
    )
)
