"""Our own forward pass for Llama/Qwen-style decoders, over a ragged batch with per-session KV.

Supported: RMSNorm, RoPE (default type, the model's theta), grouped-query attention, Qwen3's per-head
q/k RMSNorm and Qwen2-style q/k/v biases when the weights have them, SwiGLU MLP, tied or separate
output embedding. The sizes come from the model's `ModelShape` (`pearl.perf.models`, the project's one
shape record, read from the transformers config); the rest of the architecture (norm epsilon, RoPE
theta, q/k norms, biases) is `DecoderArch`. Weights are plain tensors taken from a transformers state
dict (Hugging Face names), with q/k/v and gate/up fused into one matrix each so a layer runs two big
matmuls instead of five; `load_state_dict` writes each named tensor into its slice of the fused matrix,
so a weight update (whole or partial) never needs the transformers model.

A ragged batch is a list of sequences, each contributing a chunk of new tokens (a prefill chunk or one
decode token) that attends over that session's cached KV plus the chunk, causally. Logits are computed
only for the rows that need a sample. This module does no scheduling and no sampling.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from pearl.errors import ConfigError
from pearl.perf.models import ModelShape, model_from_hf_config
from pearl.real.kvcache import KVCache, KVLayout
from pearl.real.padded import PaddedKV, copy_all


@dataclass(frozen=True)
class DecoderArch:
    """What the forward pass needs beyond the shape numbers (those are the model's `ModelShape`)."""

    eps: float  # RMSNorm epsilon
    rope_theta: float
    qk_norm: bool  # Qwen3: per-head RMSNorm of q and k
    qkv_bias: bool  # Qwen2: q/k/v projection biases

    @staticmethod
    def from_hf_config(cfg: Any) -> "DecoderArch":
        """From a transformers config; ConfigError for what this forward pass does not implement."""
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise ConfigError(f"model hidden_act {cfg.hidden_act!r} is not supported (only 'silu')")
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise ConfigError(f"model rope_type {kind!r} is not supported (only 'default')")
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", False):
            raise ConfigError("models with sliding-window attention are not supported")
        qwen2 = cfg.model_type == "qwen2"  # q/k/v biases always, no o_proj bias
        if getattr(cfg, "mlp_bias", False) or (getattr(cfg, "attention_bias", False) and not qwen2):
            raise ConfigError(f"model {cfg.model_type!r} with MLP or output-projection biases is not supported")
        return DecoderArch(cfg.rms_norm_eps, float(theta), qk_norm=cfg.model_type == "qwen3", qkv_bias=qwen2)


@dataclass
class SeqChunk:
    """One sequence's part of a ragged batch: `token_ids` go at positions start .. start+len-1."""

    session: str
    start: int
    token_ids: list[int]
    want_logits: bool


class Decoder:
    """The forward pass of a dense decoder: the sizes from `shape` (a ModelShape), the rest from `arch`."""

    def __init__(self, shape: ModelShape, arch: DecoderArch, dtype: torch.dtype = torch.float32,
                 device: str = "cpu"):
        if shape.is_moe:
            raise ConfigError(f"model {shape.name!r}: mixture-of-experts layers are not supported")
        self.shape, self.arch, self.dtype, self.device = shape, arch, dtype, torch.device(device)
        s = shape
        self.q_size, self.kv_size = s.num_q_heads * s.head_dim, s.num_kv_heads * s.head_dim

        def z(*dims: int) -> torch.Tensor:
            return torch.zeros(*dims, dtype=dtype, device=self.device)

        self.embed = z(s.vocab, s.hidden)
        self.lm_head = self.embed if s.tie_embeddings else z(s.vocab, s.hidden)
        self.final_norm = z(s.hidden)
        self.layers = [{
            "in_norm": z(s.hidden), "post_norm": z(s.hidden),
            "qkv": z(self.q_size + 2 * self.kv_size, s.hidden),
            "qkv_b": z(self.q_size + 2 * self.kv_size) if arch.qkv_bias else None,
            "q_norm": z(s.head_dim) if arch.qk_norm else None,
            "k_norm": z(s.head_dim) if arch.qk_norm else None,
            "o": z(s.hidden, self.q_size), "gate_up": z(2 * s.ffn, s.hidden),
            "down": z(s.hidden, s.ffn),
        } for _ in range(s.num_layers)]
        self.version = 0
        inv = 1.0 / (arch.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float32) / s.head_dim))
        self._inv_freq = inv.to(self.device)
        empty = torch.empty(0, s.head_dim, dtype=dtype, device=self.device)
        self._rope_table = (empty, empty)  # (cos, sin) by position (`_rope`)

    @classmethod
    def from_hf(cls, model: Any, dtype: torch.dtype = torch.float32, version: int = 0) -> "Decoder":
        """A decoder holding a copy of a transformers model's weights, computing in `dtype`."""
        cfg = model.config
        arch = DecoderArch.from_hf_config(cfg)  # first: it names what we do not support
        shape = model_from_hf_config(cfg, getattr(cfg, "name_or_path", "") or "custom", dtype=str(dtype))
        dec = cls(shape, arch, dtype, str(next(model.parameters()).device))
        dec.load_state_dict(model.state_dict(), version)
        return dec

    def kv_layout(self) -> KVLayout:
        return KVLayout(self.shape.num_layers, self.shape.num_kv_heads, self.shape.head_dim, self.dtype)

    # ------------------------------------------------------------ weights
    def _slot(self, name: str) -> tuple[torch.Tensor, slice | None] | None:
        """Where a Hugging Face weight lives in our tensors: (tensor, row slice or None for all)."""
        s, q, kv = self.shape, self.q_size, self.kv_size
        if name == "model.embed_tokens.weight":
            return self.embed, None
        if name == "model.norm.weight":
            return self.final_norm, None
        if name == "lm_head.weight":
            return (None if s.tie_embeddings else (self.lm_head, None))  # tied: the embedding is the head
        parts = name.split(".")
        if len(parts) < 5 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
            return None
        i = int(parts[2])
        if i >= s.num_layers:
            return None
        L, rest = self.layers[i], ".".join(parts[3:])
        qkv_rows = {"q": slice(0, q), "k": slice(q, q + kv), "v": slice(q + kv, q + 2 * kv)}
        table: dict[str, tuple[torch.Tensor | None, slice | None]] = {
            "input_layernorm.weight": (L["in_norm"], None),
            "post_attention_layernorm.weight": (L["post_norm"], None),
            "self_attn.o_proj.weight": (L["o"], None),
            "self_attn.q_norm.weight": (L["q_norm"], None),
            "self_attn.k_norm.weight": (L["k_norm"], None),
            "mlp.gate_proj.weight": (L["gate_up"], slice(0, s.ffn)),
            "mlp.up_proj.weight": (L["gate_up"], slice(s.ffn, 2 * s.ffn)),
            "mlp.down_proj.weight": (L["down"], None),
        }
        for p, rows in qkv_rows.items():
            table[f"self_attn.{p}_proj.weight"] = (L["qkv"], rows)
            table[f"self_attn.{p}_proj.bias"] = (L["qkv_b"], rows)
        hit = table.get(rest)
        return None if hit is None or hit[0] is None else hit  # type: ignore[return-value]

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Copy Hugging Face-named weights in (all or some). Unknown weight names are an error: a state
        dict from another model silently ignored would leave the engine sampling from stale weights."""
        unknown = []
        for name, t in state_dict.items():
            if name.endswith("rotary_emb.inv_freq"):
                continue
            slot = self._slot(name)
            if slot is None:
                if not (name == "lm_head.weight" and self.shape.tie_embeddings):
                    unknown.append(name)
                continue
            dst, rows = slot
            view = dst if rows is None else dst[rows]
            if tuple(view.shape) != tuple(t.shape):
                raise ConfigError(f"weight {name!r} has shape {tuple(t.shape)}, expected {tuple(view.shape)}")
            with torch.no_grad():
                view.copy_(t.detach())
        if unknown:
            raise ConfigError(f"{len(unknown)} weight(s) do not belong to this model, e.g. {unknown[:3]}")
        if version is not None:
            self.version = version

    # ------------------------------------------------------------ forward
    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at `positions`. The table is read once and replaced whole: engines sharing this
        decoder (`TorchEngine(share_weights_with=...)`) may step at once on threads, and one that grew
        the table must not index another's shorter one, nor cos and sin of two builds."""
        need = int(positions.max()) + 1
        cos, sin = self._rope_table
        if need > cos.shape[0]:
            n = max(need, 2 * cos.shape[0], 256)
            # float32 like transformers, so positions far out round the same way
            freqs = torch.arange(n, dtype=torch.float32, device=self.device)[:, None] * self._inv_freq[None]
            emb = torch.cat([freqs, freqs], dim=-1)
            cos, sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
            self._rope_table = (cos, sin)
        return cos[positions], sin[positions]

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.arch.eps)
        return w * xf.to(x.dtype)

    @torch.inference_mode()
    # long: one decoder pass in one piece, read side by side with the HF forward it is parity-tested on
    def forward(self, chunks: list[SeqChunk], kv: KVCache) -> torch.Tensor:
        """Run the chunks, append their KV to `kv`, return logits [n_want, vocab] in chunk order."""
        s = self.shape
        ids, pos, rows, off = [], [], [], 0
        for c in chunks:
            n = len(c.token_ids)
            ids += c.token_ids
            pos += range(c.start, c.start + n)
            if c.want_logits:
                rows.append(off + n - 1)
            kv.reserve(c.session, c.start + n)
            off += n
        input_ids = torch.tensor(ids, device=self.device)
        cos, sin = self._rope(torch.tensor(pos, device=self.device))
        cos, sin = cos[:, None, :], sin[:, None, :]
        T, g = len(ids), s.num_q_heads // s.num_kv_heads
        # Per chunk, views built once per step and unbound per layer (a decode step on CPU is bound by
        # the number of small ops per layer and sequence, not by arithmetic): where the new KV goes,
        # the keys and values attended over, and the causal mask of a multi-token chunk.
        sizes = [len(c.token_ids) for c in chunks]
        # Single-token decodes (two or more) attend in one batched call over a padded K/V mirror and
        # write their new KV to their sessions once after the last layer; the rest (prefill chunks, or
        # a lone decode) keep the per-sequence path.
        dec_idx = [i for i, n in enumerate(sizes) if n == 1] if len(chunks) > 1 else []
        if len(dec_idx) < 2:
            dec_idx = []
        in_batch = set(dec_idx)
        # The mirror is the KV cache's (`KVCache.mirror`), not the decoder's: engines that share one
        # copy of the weights (and may step at once, on threads) each step over their own cache.
        if kv.mirror is None:
            kv.mirror = PaddedKV()
        pad = kv.mirror
        batched = pad.prepare(kv, [chunks[i] for i in dec_idx]) if dec_idx else None
        all_dec = len(dec_idx) == len(chunks)
        per_idx = [i for i in range(len(chunks)) if i not in in_batch]
        dsts, keys, values, masks = [], [], [], []
        for i in per_idx:
            c, n = chunks[i], sizes[i]
            buf, end = kv.buffer(c.session), c.start + n
            dsts.append(buf[:, :, :, c.start:end].unbind(0))
            keys.append(buf[:, 0:1, :, :end].unbind(0))
            values.append(buf[:, 1:2, :, :end].unbind(0))
            masks.append(_chunk_mask(c.start, n, g, self.device))
        kvh, d = s.num_kv_heads, s.head_dim
        if dec_idx and not all_dec:
            starts = [0]
            for n in sizes:
                starts.append(starts[-1] + n)
            dec_rows = torch.tensor([starts[i] for i in dec_idx], device=self.device)
        x = F.embedding(input_ids, self.embed)
        for li, L in enumerate(self.layers):
            h = self._norm(x, L["in_norm"])
            qkv = F.linear(h, L["qkv"], L["qkv_b"])
            q = qkv[:, : self.q_size].view(T, s.num_q_heads, d)
            k = qkv[:, self.q_size: self.q_size + self.kv_size].view(T, kvh, d)
            v = qkv[:, self.q_size + self.kv_size:].view(T, kvh, d)
            if self.arch.qk_norm:
                q, k = self._norm(q, L["q_norm"]), self._norm(k, L["k_norm"])
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            new_kv = torch.stack([k, v]).transpose(1, 2)  # [2, kv_heads, T, head_dim]
            if per_idx:
                pieces = new_kv.split(sizes, dim=2)
                copy_all([dst[li] for dst in dsts], tuple(pieces[i] for i in per_idx))
            # GQA without copying K/V: the g query heads sharing a KV head act as g query rows (g×n
            # for a chunk), so SDPA sees [1, kv_heads, rows, head_dim]. 4-D operands: the CPU kernel
            # is several times slower on 3-D ones.
            q4 = q.view(T, kvh, g, d)
            if batched is not None:
                # [B, kv_heads, g, head_dim] queries over [B, kv_heads, max_len, head_dim] padded K/V
                if all_dec:
                    bq, bkv = q4, new_kv
                else:
                    bq, bkv = q4.index_select(0, dec_rows), new_kv.index_select(2, dec_rows)
                bk, bv = batched.layer(li, bkv)
                bout = F.scaled_dot_product_attention(bq, bk, bv, attn_mask=batched.mask)
            if all_dec:
                out = bout
            else:
                outs = []
                for qc, n, ks, vs, mask in zip(q4.split(sizes), sizes, *_spread(per_idx, len(sizes), keys, values, masks)):
                    if ks is None:
                        outs.append(qc)  # a batched decode row: placeholder, filled from bout below
                    elif n == 1:
                        outs.append(F.scaled_dot_product_attention(qc, ks[li], vs[li]))
                    else:
                        qg = qc.permute(1, 2, 0, 3).reshape(1, kvh, g * n, d)
                        o = F.scaled_dot_product_attention(qg, ks[li], vs[li], attn_mask=mask)
                        outs.append(o.view(kvh, g, n, d).permute(2, 0, 1, 3))
                out = torch.cat(outs) if len(outs) > 1 else outs[0]
                if batched is not None:
                    out.index_copy_(0, dec_rows, bout)
            x = x + F.linear(out.reshape(T, self.q_size), L["o"])
            h = self._norm(x, L["post_norm"])
            gu = F.linear(h, L["gate_up"])
            x = x + F.linear(F.silu(gu[:, : s.ffn]) * gu[:, s.ffn:], L["down"])
        if batched is not None:
            pad.done(kv, [chunks[i] for i in dec_idx])
        for c in chunks:
            kv.commit(c.session, c.start, c.token_ids)
        if not rows:
            return torch.empty(0, s.vocab, dtype=self.dtype, device=self.device)
        h = self._norm(x[torch.tensor(rows, device=self.device)], self.final_norm)
        return F.linear(h, self.lm_head)


def _spread(idx: list[int], n: int, *cols: list) -> list[list]:
    """Columns indexed by `idx` spread to length n, None elsewhere."""
    out = []
    for col in cols:
        full: list = [None] * n
        for i, v in zip(idx, col):
            full[i] = v
        out.append(full)
    return out


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _chunk_mask(start: int, n: int, g: int, device: torch.device) -> torch.Tensor | None:
    """Bool mask [g·n, start+n]: query i (at position start+i) sees keys 0..start+i. None for one token,
    which sees everything cached. Built once per step and shared by every layer."""
    if n == 1:
        return None
    qpos = torch.arange(start, start + n, device=device)
    m = torch.arange(start + n, device=device)[None, :] <= qpos[:, None]
    return m.repeat(g, 1)
