"""Hugging Face model folders: any Llama / Qwen2 / Qwen3 checkpoint by local path, and `convert-gguf`.

A model folder holds `config.json`, safetensors weights (`model.safetensors` or shards with an index)
and the tokenizer files (`tokenizer.json` or a vocabulary, `tokenizer_config.json`), as transformers'
`save_pretrained` writes them. `model: /path/to/dir` (or `model: {path: /path/to/dir}`) in a
`pearl train` config loads it for the trainer (transformers) and for our torch engine
(`pearl.real.modeling`, whose sizes come from the folder's config.json through
`pearl.perf.models.model_from_hf_config`). Nothing is downloaded: the folder must be complete.

Every problem is one line, before the weights load: no such folder, no config.json, an architecture
our engine does not run, no safetensors weights, no tokenizer. A tokenizer without a chat template is
given ChatML markers as plain text (`pearl.real.models.HFTokenizer`). `pearl.real.models.load_model`
loads a folder when its `model` argument is a path; `pearl.real.models.convert_gguf`
(`pearl convert-gguf`) writes the embedded SmolLM2 as such a folder.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pearl.errors import ConfigError, ResourceError, one_line
from pearl.perf.models import model_from_hf_config

SUPPORTED_TYPES = ("llama", "qwen2", "qwen3")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def read_folder_config(path: str) -> dict[str, Any]:
    """The folder's config.json, checked: a one-line ConfigError for anything our engine cannot run."""
    p = Path(path).expanduser()
    label = f"model {path!r}"
    if not p.is_dir():
        raise ConfigError(f"{label}: no such folder")
    cfg_path = p / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"{label}: no config.json in the folder (expected a Hugging Face model folder)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{label}: cannot read config.json ({one_line(str(err))})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{label}: config.json is not a JSON object")
    kind = cfg.get("model_type")
    if kind not in SUPPORTED_TYPES:
        raise ConfigError(f"{label}: model_type {kind!r} is not supported; supported: {', '.join(SUPPORTED_TYPES)}")
    if not any(p.glob("*.safetensors")):
        raise ConfigError(f"{label}: no *.safetensors weights in the folder")
    if not any((p / f).is_file() for f in _TOKENIZER_FILES):
        raise ConfigError(f"{label}: no tokenizer files (one of {', '.join(_TOKENIZER_FILES)}) in the folder")
    model_from_hf_config(cfg, path, dtype="float32")  # missing shape fields -> one-line ConfigError
    return cfg


def folder_context(path: str) -> int | None:
    """The positions the folder's model attends over (max_position_embeddings), if it says."""
    try:
        v = read_folder_config(path).get("max_position_embeddings")
    except ConfigError:
        return None
    return int(v) if isinstance(v, int) and v > 0 else None


def load_folder(path: str, dtype: Any = None) -> tuple[Any, Any]:
    """The transformers model (in `dtype`, default float32) and tokenizer of a model folder (offline)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = dtype or torch.float32

    p = Path(path).expanduser()
    try:
        tok = AutoTokenizer.from_pretrained(p, local_files_only=True)
    except Exception as err:  # transformers raises many kinds for a bad tokenizer folder
        raise ConfigError(f"model {path!r}: cannot load the tokenizer ({type(err).__name__}: "
                          f"{one_line(str(err))[:300]})") from None
    if tok.eos_token_id is None:
        raise ConfigError(f"model {path!r}: the tokenizer has no eos token (set eos_token in tokenizer_config.json)")
    try:
        model = AutoModelForCausalLM.from_pretrained(p, dtype=dtype, local_files_only=True)
    except OSError as err:
        raise ResourceError(f"model {path!r}: cannot load the weights ({one_line(str(err))[:300]})") from None
    except Exception as err:
        raise ConfigError(f"model {path!r}: cannot load the weights ({type(err).__name__}: "
                          f"{one_line(str(err))[:300]})") from None
    return model.eval(), tok
