"""LLaDA (GSAI-ML/LLaDA-8B-Base/-Instruct, LLaDA-1.5): OLMo-style masked diffusion LM.

Parameter names follow the released checkpoint: ``model.transformer.{wte, blocks.N.*, ln_f, ff_out}``.
Attention is fully bidirectional; padding keys are masked (the released HF file ignores the mask, see
``models.md`` section 2.5 - for unpadded inputs the two agree exactly).
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from dare.errors import ConfigError
from dare.models.base import DiffusionConfig, DiffusionLM, rotary_attention
from dare.models.fusion import project, project_one
from dare.models.layers import RMSNorm
from dare.models.spec import FamilySpec, register_family


class LLaDAConfig(DiffusionConfig):
    """LLaDA config with the released ``config.json`` keys (OLMo ``ModelConfig`` names).

    A config.json with ``num_experts`` (LLaDA-MoE ships ``model_type: "llada"`` too) is dispatched to
    :class:`~dare.models.llada_moe.LLaDAMoEConfig` by :meth:`from_dict`.
    """

    model_type = "llada"
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "n_heads",
        "num_hidden_layers": "n_layers",
    }
    required_keys = ("d_model", "n_heads", "n_layers", "vocab_size", "rope_theta")

    def __init__(
        self,
        d_model: int | None = None,
        n_heads: int | None = None,
        n_kv_heads: int | None = None,
        n_layers: int | None = None,
        mlp_hidden_size: int | None = None,
        mlp_ratio: int = 4,
        vocab_size: int | None = None,
        embedding_size: int | None = None,
        rope_theta: float | None = None,
        rope: bool = True,
        rope_full_precision: bool = True,
        rms_norm_eps: float = 1e-5,
        block_type: str = "llama",
        activation_type: str = "silu",
        layer_norm_type: str = "rms",
        include_bias: bool = False,
        include_qkv_bias: bool = False,
        weight_tying: bool = False,
        alibi: bool = False,
        attention_layer_norm: bool = False,
        multi_query_attention: bool | None = None,
        scale_logits: bool = False,
        input_emb_norm: bool = False,
        block_group_size: int = 1,
        attention_dropout: float = 0.0,
        residual_dropout: float = 0.0,
        embedding_dropout: float = 0.0,
        max_sequence_length: int = 4096,
        init_std: float = 0.02,
        mask_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        use_cache: bool = False,
        **kwargs,
    ):
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.n_layers = n_layers
        self.mlp_hidden_size = mlp_hidden_size
        self.mlp_ratio = mlp_ratio
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        self.rope_theta = rope_theta
        self.rope = rope
        self.rope_full_precision = rope_full_precision
        self.rms_norm_eps = rms_norm_eps
        self.block_type = block_type
        self.activation_type = activation_type
        self.layer_norm_type = layer_norm_type
        self.include_bias = include_bias
        self.include_qkv_bias = include_qkv_bias
        self.weight_tying = weight_tying
        self.alibi = alibi
        self.attention_layer_norm = attention_layer_norm
        self.multi_query_attention = multi_query_attention
        self.scale_logits = scale_logits
        self.input_emb_norm = input_emb_norm
        self.block_group_size = block_group_size
        self.attention_dropout = attention_dropout
        self.residual_dropout = residual_dropout
        self.embedding_dropout = embedding_dropout
        self.max_sequence_length = max_sequence_length
        self.init_std = init_std
        self.mask_token_id = mask_token_id
        self.use_cache = use_cache
        super().__init__(eos_token_id=eos_token_id, pad_token_id=pad_token_id, **kwargs)

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        if cls is LLaDAConfig and "num_experts" in config_dict:
            from dare.models.llada_moe import LLaDAMoEConfig

            config_dict = {k: v for k, v in config_dict.items() if k != "model_type"}
            return LLaDAMoEConfig.from_dict(config_dict, **kwargs)
        return super().from_dict(config_dict, **kwargs)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def embedding_rows(self) -> int:
        return self.embedding_size or self.vocab_size

    @property
    def num_kv_heads(self) -> int:
        if self.n_kv_heads is not None:
            return self.n_kv_heads
        return 1 if self.multi_query_attention else self.n_heads

    @property
    def ffn_size(self) -> int:
        return self.mlp_hidden_size if self.mlp_hidden_size is not None else self.mlp_ratio * self.d_model

    def validate_for_model(self) -> None:
        super().validate_for_model()
        unsupported = {
            "block_type": (self.block_type, "llama"),
            "activation_type": (self.activation_type, "silu"),
            "layer_norm_type": (self.layer_norm_type, "rms"),
            "rope": (self.rope, True),
            "alibi": (self.alibi, False),
            "attention_layer_norm": (self.attention_layer_norm, False),
            "scale_logits": (self.scale_logits, False),
            "input_emb_norm": (self.input_emb_norm, False),
            "block_group_size": (self.block_group_size, 1),
        }
        for key, (value, expected) in unsupported.items():
            if value != expected:
                raise ConfigError(f"LLaDA: {key}={value!r} is not supported (released checkpoints use {expected!r})")
        for key in ("attention_dropout", "residual_dropout", "embedding_dropout"):
            if getattr(self, key):
                raise ConfigError(f"LLaDA: {key}={getattr(self, key)} is not supported (dropout must be 0)")
        if self.d_model % self.n_heads or self.n_heads % self.num_kv_heads:
            raise ConfigError(
                f"LLaDA: d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.num_kv_heads} do not divide"
            )


class LLaDALlamaBlock(nn.Module):
    """``x + attn_out(Attn(attn_norm x))`` then ``+ ff_out(silu(ff_proj h) * up_proj h)``."""

    fused_groups = {"qkv": ("q_proj", "k_proj", "v_proj"), "ff": ("ff_proj", "up_proj"), "attn_out": ("attn_out",),
                    "ff_out": ("ff_out",)}

    def __init__(self, config: LLaDAConfig, layer_idx: int):
        super().__init__()
        d, hd = config.d_model, config.head_dim
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv, self.head_dim = config.n_heads, config.num_kv_heads, hd
        self.rope_full_precision = config.rope_full_precision
        qkv_bias = config.include_bias or config.include_qkv_bias
        self.attn_norm = RMSNorm(d, config.rms_norm_eps)
        self.ff_norm = RMSNorm(d, config.rms_norm_eps)
        self.q_proj = nn.Linear(d, d, bias=qkv_bias)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=qkv_bias)
        self.v_proj = nn.Linear(d, self.n_kv * hd, bias=qkv_bias)
        self.attn_out = nn.Linear(d, d, bias=config.include_bias)
        self.ff_proj = nn.Linear(d, config.ffn_size, bias=config.include_bias)
        self.up_proj = nn.Linear(d, config.ffn_size, bias=config.include_bias)
        self.ff_out = nn.Linear(config.ffn_size, d, bias=config.include_bias)

    def forward(self, x, rope, layout, cache, backend, keep=None):
        """``keep`` (query rows): only those rows come out (:func:`dare.models.base.rotary_attention`)."""
        b, length, _ = x.shape
        h = self.attn_norm(x)
        q, k, v = project(self, "qkv", h)
        q = q.view(b, length, self.n_heads, self.head_dim)
        k = k.view(b, length, self.n_kv, self.head_dim)
        v = v.view(b, length, self.n_kv, self.head_dim)
        attn = rotary_attention(q, k, v, rope, layout, cache, self, backend, self.rope_full_precision, keep=keep)
        x = (x if keep is None else x.index_select(1, keep)) + project_one(self, "attn_out", attn)
        h = self.ff_norm(x)
        gate, up = project(self, "ff", h)
        return x + project_one(self, "ff_out", F.silu(gate) * up)


class LLaDAModel(nn.Module):
    """Holds ``transformer`` (a ModuleDict) so parameter paths match ``model.transformer.*``."""

    def __init__(self, config: LLaDAConfig):
        super().__init__()
        rows = config.embedding_rows
        modules = {
            "wte": nn.Embedding(rows, config.d_model),
            "blocks": nn.ModuleList(LLaDALlamaBlock(config, i) for i in range(config.n_layers)),
            "ln_f": RMSNorm(config.d_model, config.rms_norm_eps),
        }
        if not config.weight_tying:
            modules["ff_out"] = nn.Linear(config.d_model, rows, bias=config.include_bias)
        self.transformer = nn.ModuleDict(modules)


class LLaDAModelLM(DiffusionLM):
    """LLaDA masked diffusion LM (``architectures: ["LLaDAModelLM"]``)."""

    config_class = LLaDAConfig
    _no_split_modules = ["LLaDALlamaBlock"]

    def __init__(self, config: LLaDAConfig):
        super().__init__(config)
        self.model = LLaDAModel(config)
        self.rope_dim = config.head_dim
        self.rope_theta = float(config.rope_theta)
        self.post_init()

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.transformer.blocks

    def embed(self, input_ids):
        return self.model.transformer.wte(input_ids)

    def final_norm(self, x):
        return self.model.transformer.ln_f(x)

    def head(self, x):
        if self.config.weight_tying:
            return F.linear(x, self.model.transformer.wte.weight)
        return self.model.transformer.ff_out(x)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.transformer.wte

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.transformer.wte = value

    def get_output_embeddings(self) -> nn.Module | None:
        return None if self.config.weight_tying else self.model.transformer.ff_out


def tiny_llada_config(vocab_size: int = 264, mask_token_id: int = 259, eos_token_id: int = 258,
                      pad_token_id: int = 256, n_kv_heads: int = 4, **overrides) -> dict:
    """config.json of a tiny LLaDA (2 layers, d_model 64) with the released key names (models.md 2.6)."""
    config = dict(
        model_type="llada", architectures=["LLaDAModelLM"], d_model=64, n_heads=4, n_kv_heads=n_kv_heads,
        n_layers=2, mlp_hidden_size=128, mlp_ratio=4, vocab_size=vocab_size, embedding_size=vocab_size,
        max_sequence_length=512, rope=True, rope_theta=500000.0, rope_full_precision=True, rms_norm_eps=1e-5,
        block_type="llama", activation_type="silu", layer_norm_type="rms", layer_norm_with_affine=True,
        bias_for_layer_norm=False, include_bias=False, include_qkv_bias=False, weight_tying=False, alibi=False,
        flash_attention=False, attention_layer_norm=False, scale_logits=False, input_emb_norm=False,
        block_group_size=1, attention_dropout=0.0, residual_dropout=0.0, embedding_dropout=0.0,
        init_fn="mitchell", init_std=0.02, mask_token_id=mask_token_id, eos_token_id=eos_token_id,
        pad_token_id=pad_token_id, use_cache=False,
    )
    config.update(overrides)
    return config


LLADA = register_family(
    FamilySpec(
        name="llada",
        description="LLaDA-8B (Base/Instruct), LLaDA-1.5: masked diffusion, full attention",
        config_class=LLaDAConfig,
        model_class=LLaDAModelLM,
        attention="full",
        logit_shift=0,
        mask_token_id=126336,
        eos_token_id=126081,
        pad_token_id=126081,
        eot_token_id=126348,
        bos_token_id=126080,
        lora_targets=r".*\.blocks\.\d+\.(q_proj|k_proj|v_proj|attn_out|ff_proj|up_proj|ff_out)",
        tiny_config=tiny_llada_config,
    )
)
