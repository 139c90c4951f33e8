"""Checkpoints and saved policies of a `pearl train` run.

A checkpoint is a directory `ckpt-<step>` in the run directory holding `state.pt` (everything the
run needs to continue: trainer weights and optimizer, policy version, RNG states, the staleness
gate, the trained-step history, finished-but-untrained groups with their tokens, the groups still
in flight, the controller's decisions) and `meta.json`. It is written atomically: into a temporary
directory, each file flushed and fsynced, then renamed into place, the parent fsynced; the last
`keep` are kept. Loading takes the newest checkpoint that reads back whole; one cut off mid-write
(a leftover temporary directory, a truncated file, no `meta.json`) is skipped in favour of the one
before.

The policy is saved in Hugging Face format (`policy-<step>`, and `policy` at the end): config and
safetensors weights from `save_pretrained`, plus the tokenizer when the model has a Hugging Face one
(the embedded `tiny` model's byte tokenizer is not a transformers tokenizer: its ids are bytes).
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["latest_checkpoint", "rng_state", "save_checkpoint", "save_policy", "set_rng_state"]

PREFIX = "ckpt-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write `state` as checkpoint `step` atomically; prune all but the newest `keep`."""
    final = run_dir / f"{PREFIX}{step:06d}"
    tmp = run_dir / f".{PREFIX}{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _write(tmp / "state.pt", lambda f: torch.save(state, f))
    meta = {"step": step, "version": state.get("version"), "complete": True}
    _write(tmp / "meta.json", lambda f: f.write(json.dumps(meta).encode()))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(run_dir)
    for old in _checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint directories, oldest first (temporary ones excluded)."""
    out = []
    for p in run_dir.glob(f"{PREFIX}*"):
        try:
            out.append((int(p.name[len(PREFIX):]), p))
        except ValueError:
            continue
    return [p for _, p in sorted(out)]


def latest_checkpoint(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that reads back whole, with its state; None if there is none."""
    for path in reversed(_checkpoints(run_dir)):
        try:
            meta = json.loads((path / "meta.json").read_text())
            if not meta.get("complete"):
                continue
            state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
        except Exception:  # cut off mid-write, or damaged: the one before will do
            continue
        if isinstance(state, dict) and state.get("step") == meta.get("step"):
            return path, state
    return None


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])


def save_policy(model: Any, tokenizer: Any, path: Path) -> Path:
    """The trained policy in Hugging Face format, loadable by `AutoModelForCausalLM.from_pretrained`;
    written to a temporary directory and renamed, so a reader never sees half a policy."""
    from transformers.utils import logging as hf_logging

    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    hf_logging.disable_progress_bar()  # no progress bar in the run's log
    model.save_pretrained(tmp, safe_serialization=True)
    hf = getattr(tokenizer, "hf", None)
    if hf is not None and hasattr(hf, "save_pretrained"):
        hf.save_pretrained(tmp)
    if path.exists():
        shutil.rmtree(path)
    os.rename(tmp, path)
    return path
