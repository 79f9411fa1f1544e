"""llama.cpp's side of `agl bench llm`: the same GGUF, prompt and thread count, through
llama-cpp-python. Prints one JSON object (seconds, tokens, tokens/s).

Usage: python bench_llama_cpp.py --gguf FILE --prompt-ids JSON_LIST --decode-tokens N --threads T [--rounds R]
Batch 1 only: llama-cpp-python's API decodes one sequence at a time.
"""
import argparse
import json
import sys
import time

import llama_cpp


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompt-ids", required=True, help="JSON list of prompt token ids")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    prompt = json.loads(a.prompt_ids)
    llm = llama_cpp.Llama(
        model_path=a.gguf, n_ctx=2048, n_threads=a.threads, n_threads_batch=a.threads,
        n_batch=512, logits_all=False, verbose=False,
    )
    prefill, decode, ttft = [], [], []
    for _ in range(a.rounds):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        prefill.append(len(prompt) / (t1 - t0))
        # Greedy decode of exactly N tokens (end-of-sequence ignored), one token per eval.
        tok = llm.sample(temp=0.0)
        ttft.append(time.perf_counter() - t0)
        t2 = time.perf_counter()
        for _ in range(a.decode_tokens):
            llm.eval([tok])
            tok = llm.sample(temp=0.0)
        t3 = time.perf_counter()
        decode.append(a.decode_tokens / (t3 - t2))
    # VmHWM of this process image (ru_maxrss would include the parent's RSS at fork).
    rss_kib = 0.0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                rss_kib = float(line.split()[1])
    print(json.dumps({
        "engine": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
        "threads": a.threads,
        "prompt_tokens": len(prompt),
        "prefill_tokens_per_s": max(prefill),
        "decode_batch1_tokens_per_s": max(decode),
        "ttft_s": min(ttft),
        "peak_rss_mib": rss_kib / 1024,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
