"""The usual PyTorch path: transformers' Qwen3VLForConditionalGeneration in fp32 or bf16, timed like the service.

Run as a subprocess (``python -m ops.bench.baseline ...``) so each dtype's peak RSS is its own process's
high-water mark; the last stdout line is the JSON result. Preprocessing uses transformers' slow (PIL)
Qwen2VLImageProcessor because the fast one and the Qwen3-VL processor class need torchvision, which the
venv leaves out (pyproject.toml, the converter extra).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
from pathlib import Path

from ops.bench import workload
from ops.bench.memory import own_peak_rss_bytes


def chat_prompt(question: str, image_tokens: int) -> str:
    """The same prompt VLMPipeline builds for one image and one question (Qwen chat format)."""
    pads = "<|image_pad|>" * image_tokens
    return (f"<|im_start|>user\n<|vision_start|>{pads}<|vision_end|>{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


class TimingStreamer:
    """transformers streamer that stamps each new token; generate() first puts the prompt, which is skipped."""

    def __init__(self) -> None:
        self.prompt_seen = False
        self.stamps: list[float] = []

    def put(self, value) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def measure(checkpoint: Path, dtype: str, tokens: int, runs: int, width: int, height: int) -> dict:
    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoTokenizer, Qwen2VLImageProcessor, Qwen3VLForConditionalGeneration

    started = time.perf_counter()
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = Qwen3VLForConditionalGeneration.from_pretrained(checkpoint, dtype=torch_dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    processor = Qwen2VLImageProcessor.from_pretrained(checkpoint)
    load_s = time.perf_counter() - started

    def one(n_tokens: int) -> workload.Sample:
        begin = time.perf_counter()
        # Preprocessing is inside the timed span, as it is for the service.
        image = Image.open(io.BytesIO(workload.test_image(width, height))).convert("RGB")
        vision = processor(images=[np.asarray(image)], return_tensors="pt")
        grid = vision["image_grid_thw"]
        image_tokens = int(grid.prod()) // processor.merge_size**2
        ids = tokenizer(chat_prompt(workload.PROMPT, image_tokens), return_tensors="pt")
        streamer = TimingStreamer()
        with torch.inference_mode():
            out = model.generate(**ids, pixel_values=vision["pixel_values"].to(torch_dtype), image_grid_thw=grid,
                                 max_new_tokens=n_tokens, min_new_tokens=n_tokens, do_sample=False,
                                 streamer=streamer)
        end = time.perf_counter()
        generated = int(out.shape[1] - ids["input_ids"].shape[1])
        return workload.Sample(streamer.stamps[0] - begin, end - begin, generated)

    one(2)  # warm-up: first-call allocations and lazy inits are not what a warm server pays
    samples = []
    for i in range(runs):
        samples.append(one(tokens))
        s = samples[-1]
        print(f"[bench.baseline] {dtype} run {i + 1}/{runs}: first token {s.first_token_s:.2f}s "
              f"{s.ms_per_token:.1f} ms/token", file=sys.stderr, flush=True)
    return {"runtime": f"transformers {dtype}", "dtype": dtype, "torch_threads": torch.get_num_threads(),
            "load_s": load_s, **workload.summarize(samples), "peak_rss_bytes": own_peak_rss_bytes()}


def run_subprocess(checkpoint: Path, dtype: str, tokens: int, runs: int, width: int = 416, height: int = 277,
                   timeout: float = 1800) -> dict:
    """``measure`` in a fresh interpreter, so its peak RSS is that of this baseline alone."""
    cmd = [sys.executable, "-m", "ops.bench.baseline", "--checkpoint", str(checkpoint), "--dtype", dtype,
           "--tokens", str(tokens), "--runs", str(runs), "--width", str(width), "--height", str(height)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"transformers {dtype} baseline failed (exit {proc.returncode}); see its stderr above")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="HF checkpoint directory")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), required=True)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per answer (default 64)")
    parser.add_argument("--runs", type=int, default=2, help="measured runs after one warm-up (default 2)")
    parser.add_argument("--width", type=int, default=416)
    parser.add_argument("--height", type=int, default=277)
    args = parser.parse_args(argv)
    result = measure(args.checkpoint, args.dtype, args.tokens, args.runs, args.width, args.height)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
