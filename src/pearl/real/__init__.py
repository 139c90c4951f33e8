"""The real inference engine (torch): embedded models, our own decoder forward pass, per-session KV,
sampling, and `TorchEngine` in the mixed / prefill / decode roles. The only package that imports torch
for inference; the scheduling policy it runs is the shared, torch-free `pearl.engine.scheduler`."""
from pearl.real.engine import EngineStats, Migration, Output, TorchEngine
from pearl.real.kvcache import KVBlob, KVCache, KVLayout
from pearl.real.models import SOURCES, ByteTokenizer, LoadedModel, Tokenizer, load_model
from pearl.real.sampling import Sampler, SamplingParams

__all__ = ["TorchEngine", "Output", "Migration", "EngineStats", "KVBlob", "KVCache", "KVLayout", "SOURCES",
           "ByteTokenizer", "LoadedModel", "Tokenizer", "load_model", "Sampler", "SamplingParams"]
