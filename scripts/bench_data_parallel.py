#!/usr/bin/env python3
"""Data-parallel step time: `kiln train --distributed` under mpirun on this machine,
gradient all-reduce overlapped with backward against after it, on 1, 2 and 4 ranks.

    python3 scripts/bench_data_parallel.py [--kiln target/release/kiln] [--rounds 3] [--steps 200]

Needs a kiln built with `cargo build --release --features mpi` and Open MPI's mpirun.
Runs alternate (overlapped, not overlapped) in each round; each figure is the median
over rounds of rank 0's mean step time (the run's seconds over its steps, compilation
excluded). The all-reduce columns are rank 0's: the seconds its reductions took, the
seconds its steps were blocked on them, and the fraction hidden behind backward,
1 - blocked / reduction time.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINING = os.environ.get("KILN_TRAINING", os.path.join(HERE, "..", "..", "shared", "training"))
sys.path.insert(0, HERE)
from bench_training_vs_pytorch import gpt_data  # noqa: E402


def models(tmp):
    gx, gy = gpt_data()
    gpt = os.path.join(tmp, "gpt")
    os.makedirs(gpt, exist_ok=True)
    np.save(os.path.join(gpt, "x.npy"), gx)
    np.save(os.path.join(gpt, "y.npy"), gy)
    return {
        "lenet (batch 64)": ["lenet_digits_sgd", os.path.join(TRAINING, "digits"), "64",
                             ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "1e-4"]],
        "tiny_gpt (batch 16x64)": ["tiny_gpt_adamw", gpt, "16",
                                   ["--optimizer", "adamw", "--lr", "3e-3", "--betas", "0.9,0.95", "--weight-decay", "0.01"]],
    }


def run(kiln, ranks, model, data, batch, flags, steps, overlap, bucket_mb):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", kiln, "train",
           os.path.join(TRAINING, model, "model.onnx"), "--data", data, "--batch", batch, "--steps", str(steps),
           "--threads", "1", "--json", "--distributed", "--bucket-mb", str(bucket_mb)] + flags
    if overlap:
        cmd.append("--overlap")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    final = json.loads(out.stdout.strip().splitlines()[-1])
    ar = final["allreduce"]
    return final["seconds"] / steps * 1e3, ar["seconds"] / steps * 1e3, ar["blocked_seconds"] / steps * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kiln", default=os.path.join(HERE, "..", "target", "release", "kiln"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--bucket-mb", type=float, default=0.1)
    a = p.parse_args()
    print(subprocess.run(["sh", "-c", "lscpu | grep 'Model name'"], capture_output=True, text=True).stdout.strip())
    print(f"{a.rounds} rounds x {a.steps} steps, buckets of {a.bucket_mb} MB, 1 thread per rank")
    print("| model | ranks | step ms, overlapped | step ms, after backward | ratio | all-reduce ms/step | blocked ms/step (overlapped) | hidden |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, data, batch, flags) in models(tmp).items():
            for ranks in [int(r) for r in a.ranks.split(",")]:
                on, off = [], []
                for _ in range(a.rounds):
                    on.append(run(a.kiln, ranks, model, data, batch, flags, a.steps, True, a.bucket_mb))
                    off.append(run(a.kiln, ranks, model, data, batch, flags, a.steps, False, a.bucket_mb))
                med = lambda rows, i: statistics.median(r[i] for r in rows)
                step_on, step_off = med(on, 0), med(off, 0)
                comm, blocked = med(on, 1), med(on, 2)
                hidden = 1 - blocked / comm if comm > 0 else 0.0
                print(f"| {name} | {ranks} | {step_on:.3f} | {step_off:.3f} | {step_off / step_on:.2f}x | {comm:.3f} | {blocked:.3f} | {hidden:.0%} |")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
