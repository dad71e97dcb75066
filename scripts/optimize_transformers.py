#!/usr/bin/env python3
"""Writes onnxruntime's transformer-optimized versions of zoo models, for the zoo tests
`bert_tiny_ort_optimized` and `gpt2_tiny_ort_optimized` (tests/zoo.rs): the fused
com.microsoft ops (EmbedLayerNormalization, Attention, SkipLayerNormalization,
BiasGelu, FastGelu) that onnxruntime's optimizer writes, without torch.

    python3 scripts/optimize_transformers.py [OUT_DIR]

OUT_DIR defaults to $KILN_OPTIMIZED_ZOO, else .cache/optimized-zoo; the zoo is read
from $KILN_ZOO, else ../shared/zoo. Writes OUT_DIR/NAME/model.onnx; the data sets stay
with the original model.
"""
import os
import sys
from pathlib import Path

from onnxruntime.transformers.optimizer import optimize_model

ROOT = Path(__file__).resolve().parent.parent
MODELS = [("bert_tiny", "bert"), ("gpt2_tiny", "gpt2")]


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("KILN_OPTIMIZED_ZOO", ROOT / ".cache/optimized-zoo"))
    zoo = Path(os.environ.get("KILN_ZOO", ROOT.parent / "shared/zoo"))
    for name, model_type in MODELS:
        src, dst = zoo / name / "model.onnx", out / name / "model.onnx"
        if not src.exists():
            sys.exit(f"{src} is missing: set KILN_ZOO to the model zoo")
        if dst.exists() and dst.stat().st_mtime >= src.stat().st_mtime:
            continue
        model = optimize_model(str(src), model_type=model_type, num_heads=2, hidden_size=128, opt_level=0)
        dst.parent.mkdir(parents=True, exist_ok=True)
        model.save_model_to_file(str(dst))
        fused = sorted({n.op_type for n in model.model.graph.node if n.domain == "com.microsoft"})
        print(f"{name}: {dst} ({', '.join(fused)})")


if __name__ == "__main__":
    main()
