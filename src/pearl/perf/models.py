"""Model catalogue: the transformer shapes the cost model needs, and a reader for HF config.json files.

`ModelShape` is the project's one record of a model's shape: the simulator's cost model, the real
engine's forward pass (`pearl.real.modeling`) and the real runtime's memory estimate all read it.
`MODELS` is the one catalogue of model names: the simulator's large models and the real engine's
embedded ones (`tiny`, `smollm2-135m`, whose weights `pearl.real.models.SOURCES` loads under the same
names). This module must stay importable without torch.

A `ModelShape` is only shapes; parameter counts, weight bytes and KV bytes per token are derived from
them. Counts include embeddings, the LM head (unless tied), attention and MLP/expert matrices, the
MoE router and RMSNorm weights; biases and Qwen3's per-head q/k norms (a few hundred parameters per
layer) are ignored.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pearl.errors import ConfigError, UnknownNameError


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer. With `num_experts` > 0 every layer's MLP is a routed MoE block."""

    name: str
    num_layers: int
    hidden: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    ffn: int  # dense MLP intermediate size (unused when every layer is MoE)
    vocab: int
    num_experts: int = 0
    experts_per_token: int = 0
    expert_ffn: int = 0
    dtype_bytes: int = 2
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden", "num_q_heads", "num_kv_heads", "head_dim", "vocab", "dtype_bytes"):
            if getattr(self, f) <= 0:
                raise ConfigError(f"model {self.name!r}: {f} must be > 0 (got {getattr(self, f)})")
        if self.num_experts < 0 or self.experts_per_token < 0:
            raise ConfigError(f"model {self.name!r}: expert counts must be >= 0")
        if self.is_moe and not (1 <= self.experts_per_token <= self.num_experts and self.expert_ffn > 0):
            raise ConfigError(f"model {self.name!r}: a MoE model needs 1 <= experts_per_token "
                              f"({self.experts_per_token}) <= num_experts ({self.num_experts}) "
                              f"and expert_ffn > 0 (got {self.expert_ffn})")
        if not self.is_moe and self.ffn <= 0:
            raise ConfigError(f"model {self.name!r}: ffn must be > 0 for a dense model (got {self.ffn})")

    # ------------------------------------------------------------ derived sizes
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attn_params_per_layer(self) -> int:
        """Q, K, V and O projections."""
        q = self.num_q_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return self.hidden * q + 2 * self.hidden * kv + q * self.hidden

    @property
    def expert_params(self) -> int:
        """One routed expert of one layer (gate, up, down)."""
        return 3 * self.hidden * self.expert_ffn if self.is_moe else 0

    @property
    def embedding_params(self) -> int:
        """One vocab x hidden matrix (the input table; the LM head is another unless tied)."""
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def _mlp_dense_params_per_layer(self) -> int:
        """Per-layer MLP parameters that every token uses: the router for MoE, the whole MLP if dense."""
        return self.hidden * self.num_experts if self.is_moe else 3 * self.hidden * self.ffn

    @property
    def dense_params_active(self) -> int:
        """Everything but the routed experts (embeddings, LM head, attention, norms, router / MLP)."""
        per_layer = self.attn_params_per_layer + 2 * self.hidden + self._mlp_dense_params_per_layer
        head = 0 if self.tie_embeddings else self.lm_head_params
        return self.embedding_params + head + self.num_layers * per_layer + self.hidden  # + final norm

    @property
    def params_total(self) -> int:
        return self.dense_params_active + self.num_layers * self.num_experts * self.expert_params

    @property
    def params_active(self) -> int:
        """Parameters one token uses (MoE: only its top-k experts)."""
        return self.dense_params_active + self.num_layers * self.experts_per_token * self.expert_params

    @property
    def matmul_params_per_token(self) -> int:
        """Parameters one token multiplies through, excluding the LM head and the embedding lookup
        (a gather, not a matmul): the transformer body, 2 FLOPs each per token."""
        body = self.params_active - self.embedding_params
        return body if self.tie_embeddings else body - self.lm_head_params

    @property
    def weight_bytes(self) -> int:
        return self.params_total * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, all KV heads."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


def _qwen3(name: str, layers: int, hidden: int, q: int, kv: int, ffn: int, **moe: int) -> ModelShape:
    return ModelShape(name, layers, hidden, q, kv, 128, ffn, 151936, **moe)


MODELS: dict[str, ModelShape] = {
    "qwen3-8b": _qwen3("qwen3-8b", 36, 4096, 32, 8, 12288),
    # Every Qwen3-30B-A3B layer is MoE (decoder_sparse_step 1); its intermediate_size 6144 is unused.
    "qwen3-30b-a3b": _qwen3("qwen3-30b-a3b", 48, 2048, 32, 4, 6144,
                            num_experts=128, experts_per_token=8, expert_ffn=768),
    "qwen3-32b": _qwen3("qwen3-32b", 64, 5120, 64, 8, 25600),
    # The real engine's embedded models, in float32 (the dtype the engine computes in). `tiny`'s
    # transformers config is built from this entry (`pearl.real.models.tiny_config`); a loaded
    # checkpoint is checked against its entry (`pearl.real.models.load_model`).
    # tiny: a 2-layer Qwen3; vocab = the byte tokenizer's 256 bytes + 4 specials.
    "tiny": ModelShape("tiny", num_layers=2, hidden=64, num_q_heads=4, num_kv_heads=2, head_dim=16, ffn=192,
                       vocab=260, dtype_bytes=4, tie_embeddings=True),
    # SmolLM2-135M-Instruct (Llama architecture).
    "smollm2-135m": ModelShape("smollm2-135m", num_layers=30, hidden=576, num_q_heads=9, num_kv_heads=3,
                               head_dim=64, ffn=1536, vocab=49152, dtype_bytes=4, tie_embeddings=True),
}

_DTYPE_BYTES = {"float64": 8, "double": 8, "float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
                "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1}


def _field(cfg: dict[str, Any], key: str, name: str, *alts: str) -> Any:
    for k in (key, *alts):
        if cfg.get(k) is not None:
            return cfg[k]
    raise ConfigError(f"model config {name!r}: missing required field '{key}'")


def _int(value: Any, key: str, name: str) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"model config {name!r}: field '{key}' = {value!r} is not an integer") from None
    if out != value and not isinstance(value, str):
        raise ConfigError(f"model config {name!r}: field '{key}' = {value!r} is not an integer")
    return out


def model_from_hf_config(cfg: Any, name: str = "custom", dtype: str | None = None) -> ModelShape:
    """A `ModelShape` from a Hugging Face config.json (Llama / Qwen2 / Qwen3 / Qwen3-MoE / Mistral /
    Mixtral field names), given as a dict or as a transformers config object (anything with `to_dict`).
    Multimodal configs that nest the language model under `text_config` work too. `dtype` ("float32",
    "bfloat16", ...; a "torch." prefix is ignored) overrides the config's `torch_dtype`: the dtype the
    weights are held in where that is not the checkpoint's (the real engine computes in float32)."""
    if not isinstance(cfg, dict) and callable(getattr(cfg, "to_dict", None)):
        cfg = cfg.to_dict()
    if not isinstance(cfg, dict):
        raise ConfigError(f"model config {name!r}: expected a JSON object, got {type(cfg).__name__}")
    if isinstance(cfg.get("text_config"), dict) and "hidden_size" not in cfg:
        cfg = cfg["text_config"]
    req = {k: _int(_field(cfg, k, name), k, name)
           for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")}
    heads, hidden = req["num_attention_heads"], req["hidden_size"]
    kv_heads = _int(cfg.get("num_key_value_heads") or heads, "num_key_value_heads", name)
    head_dim = cfg.get("head_dim") or (hidden // heads if heads else 0)
    n_exp = _int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0, "num_experts", name)
    if n_exp:
        k = _int(_field(cfg, "num_experts_per_tok", name), "num_experts_per_tok", name)
        # Qwen-MoE names the expert width moe_intermediate_size; Mixtral reuses intermediate_size.
        e_ffn = _int(_field(cfg, "moe_intermediate_size", name, "intermediate_size"),
                     "moe_intermediate_size", name)
        ffn = _int(cfg.get("intermediate_size") or 0, "intermediate_size", name)
    else:
        k, e_ffn = 0, 0
        ffn = _int(_field(cfg, "intermediate_size", name), "intermediate_size", name)
    dtype = str(dtype or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
    if dtype not in _DTYPE_BYTES:
        raise ConfigError(f"model config {name!r}: field 'torch_dtype' = {dtype!r} is not one of "
                          f"{', '.join(sorted(_DTYPE_BYTES))}")
    return ModelShape(name=name, num_layers=req["num_hidden_layers"], hidden=hidden, num_q_heads=heads,
                      num_kv_heads=kv_heads, head_dim=_int(head_dim, "head_dim", name), ffn=ffn,
                      vocab=req["vocab_size"], num_experts=n_exp, experts_per_token=k, expert_ffn=e_ffn,
                      dtype_bytes=_DTYPE_BYTES[dtype], tie_embeddings=bool(cfg.get("tie_word_embeddings", False)))


def get_model(name_or_path: str) -> ModelShape:
    """A catalogue model (case-insensitive name) or the model described by a HF config.json
    (a path to the file, or to a directory holding one)."""
    key = str(name_or_path).strip()
    if key.lower() in MODELS:
        return MODELS[key.lower()]
    path = Path(key).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UnknownNameError("model", key, list(MODELS))
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"model config {str(path)!r}: cannot read JSON ({e})") from None
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return model_from_hf_config(cfg, name=name or "custom")
