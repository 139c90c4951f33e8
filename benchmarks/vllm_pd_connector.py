"""Does a vLLM KV connector hand a prefill's KV to a decode engine on CPU? The evidence for docs/engines.md.

vLLM's example shared-storage connector (`ExampleConnector`): a prefill engine (`kv_producer`) runs a
300-token prompt for one token and saves its KV to a folder (safetensors per layer); a second engine
(`kv_consumer`, a separate process, as in vLLM's disaggregated-prefill example) decodes the same prompt
and should load that KV instead of computing it. Printed: what the consumer injected, how many prompt
tokens vLLM reports as cached, and whether its greedy tokens equal our torch engine's on the prompt.
Needs the vllm extra (`make setup-vllm`). About 2 minutes on 2 cores.
Usage: python benchmarks/vllm_pd_connector.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

PROMPT = list(range(100, 400))
NEW = 8


def engine_side(role: str, store: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import EngineArgs, LLMEngine, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    from pearl.real.models import smollm2_cache_dir

    kt = KVTransferConfig(kv_connector="ExampleConnector", kv_role=f"kv_{role}",
                          kv_connector_extra_config={"shared_storage_path": store})
    eng = LLMEngine.from_engine_args(EngineArgs(
        model=str(smollm2_cache_dir()), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=300 << 20,
        max_model_len=2048, seed=0, kv_transfer_config=kt, enable_prefix_caching=False))
    eng.add_request("r", TokensPrompt(prompt_token_ids=PROMPT),
                    SamplingParams(temperature=0, max_tokens=1 if role == "producer" else NEW, ignore_eos=True))
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                print(f"RESULT {role} tokens={o.outputs[0].token_ids} cached={o.num_cached_tokens}", flush=True)


def main() -> int:
    if len(sys.argv) == 3:
        engine_side(sys.argv[1], sys.argv[2])
        return 0
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print("vllm is not importable (make setup-vllm): nothing to check")
        return 0
    from pearl.real.engine import TorchEngine
    from pearl.real.models import load_model
    from pearl.real.sampling import SamplingParams

    ref = TorchEngine(load_model("smollm2-135m")).generate(
        [PROMPT], SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True))[0].token_ids
    with tempfile.TemporaryDirectory() as store:
        got = {}
        for role in ("producer", "consumer"):
            res = subprocess.run([sys.executable, __file__, role, store], capture_output=True, text=True)
            lines = (res.stdout + res.stderr).splitlines()
            for line in lines:
                if line.startswith("RESULT"):
                    print(line)
                elif "Inject KV cache" in line or "External Cache Hit" in line:
                    print(f"{role}: {line.split('] ')[-1]}")  # vLLM's log line without its prefix
            got[role] = next((ln for ln in lines if ln.startswith("RESULT")), None)
            if res.returncode != 0 or got[role] is None:
                print(f"{role} failed (exit {res.returncode}): {lines[-1] if lines else ''}")
                return 1
        files = sum(1 for _ in Path(store).rglob("*.safetensors"))
        size = sum(f.stat().st_size for f in Path(store).rglob("*.safetensors"))
    print(f"store: {files} files, {size / 2**20:.1f} MiB; our torch engine's greedy tokens: {ref}")
    same = f"tokens={ref}" in got["consumer"]
    print(f"== consumer decodes from the producer's KV: {'yes' if 'cached=0' not in got['consumer'] else 'no'}; "
          f"greedy tokens equal ours: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
