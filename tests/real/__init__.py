"""Tests of the real (torch) engine. Shared helpers: reference runs with transformers."""
from __future__ import annotations

import torch

# One intra-op thread: `make test` runs two pytest workers on two cores, and OpenMP threads that wait
# at barriers for a core someone else holds make small kernels 10-100x slower.
torch.set_num_threads(1)


def hf_greedy(lm, prompt: list[int], n: int) -> list[int]:
    """transformers `generate`, greedy, exactly n new tokens (eos ignored)."""
    out = lm.hf_model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                               eos_token_id=None, pad_token_id=0, attention_mask=torch.ones(1, len(prompt)))
    return out[0, len(prompt):].tolist()


def hf_logprobs(lm, ids: list[int], start: int) -> torch.Tensor:
    """The trainer's way: one forward over the whole sequence, log_softmax, gather ids[start:]."""
    with torch.no_grad():
        logits = lm.hf_model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], dim=-1)
    return lp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0][start - 1:]
