#!/usr/bin/env python3
"""Training steps per second: Kiln against PyTorch, on the same machine in the same
command, alternating the two (rounds), 2 threads each by default.

The PyTorch side is a replica of each model of ../shared/training, built in code with
the same initial weights (step_0.npz); before timing, the script checks that the
replica reproduces the reference run's first losses, so both sides train the same
network. Kiln runs `kiln train` on the same data (its step time is the trainer's own:
binding, the step's run and the state hand-over; batching on the host excluded, as
for PyTorch, whose batches are prepared before the clock starts).

    python3 scripts/bench_training_vs_pytorch.py [--kiln target/release/kiln]
        [--steps 100] [--rounds 3] [--threads 2] [--device cpu] [--only lenet|gpt]

Needs torch and numpy (pip install torch numpy).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINING = os.environ.get("KILN_TRAINING", os.path.join(ROOT, "..", "shared", "training"))


def torch_models(torch):
    nn, F = torch.nn, torch.nn.functional

    class LeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))

        def forward(self, x):
            return self.head(self.features(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.qkv, self.proj = nn.LayerNorm(64), nn.Linear(64, 192), nn.Linear(64, 64)
            self.ln2, self.fc, self.out = nn.LayerNorm(64), nn.Linear(64, 256), nn.Linear(256, 64)

        def forward(self, x, mask):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(64, dim=2)
            heads = lambda t: t.view(b, s, 2, 32).transpose(1, 2)
            q, k, v = heads(q), heads(k), heads(v)
            a = ((q @ k.transpose(-2, -1)) / np.sqrt(32.0) + mask).softmax(-1) @ v
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, 64))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class TinyGpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(256, 64), nn.Parameter(torch.zeros(64, 64))
            self.blocks = nn.ModuleList([Block(), Block()])
            self.ln, self.head = nn.LayerNorm(64), nn.Linear(64, 256, bias=False)

        def forward(self, ids):
            s = ids.shape[1]
            mask = torch.full((s, s), float("-inf")).triu(1)
            x = self.tok(ids) + self.pos[:s]
            for b in self.blocks:
                x = b(x, mask)
            return self.head(self.ln(x))

    return LeNet, TinyGpt


def load_run(name):
    with open(os.path.join(TRAINING, name, "reference.json")) as f:
        return json.load(f)


def gpt_data():
    corpus = open(os.path.join(TRAINING, "corpus.txt"), "rb").read()
    n = (len(corpus) - 65) // 7
    c = np.frombuffer(corpus, dtype=np.uint8).astype(np.int64)
    x = np.stack([c[7 * i:7 * i + 64] for i in range(n)])
    y = np.stack([c[7 * i + 1:7 * i + 65] for i in range(n)])
    return x, y


def setups():
    digits_x = np.load(os.path.join(TRAINING, "digits", "train_x.npy"))
    digits_y = np.load(os.path.join(TRAINING, "digits", "train_y.npy"))
    gx, gy = gpt_data()
    return {
        "lenet": dict(run="lenet_digits_sgd", cls=0, x=digits_x, y=digits_y, batch=64,
                      flags=["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "1e-4"]),
        "gpt": dict(run="tiny_gpt_adamw", cls=1, x=gx, y=gy, batch=16,
                    flags=["--optimizer", "adamw", "--lr", "3e-3", "--betas", "0.9,0.95", "--weight-decay", "0.01"]),
    }


def torch_optimizer(torch, model, run):
    r = load_run(run)
    if r["optimizer"] == "sgd":
        return torch.optim.SGD(model.parameters(), lr=r["lr"], momentum=r["momentum"], weight_decay=r["weight_decay"])
    return torch.optim.AdamW(model.parameters(), lr=r["lr"], betas=(r["beta1"], r["beta2"]), eps=r["epsilon"], weight_decay=r["weight_decay"])


def torch_model(torch, s):
    cls = torch_models(torch)[s["cls"]]
    m = cls()
    w = np.load(os.path.join(TRAINING, s["run"], "step_0.npz"))
    state = {k: torch.tensor(w[k]) for k in w.files}
    m.load_state_dict(state, strict=False)
    return m


def check_replica(torch, s):
    """The replica's first losses on the reference batches equal the reference's."""
    r = load_run(s["run"])
    m = torch_model(torch, s)
    opt = torch_optimizer(torch, m, s["run"])
    m.train()
    for k in range(3):
        idx = r["batches"][k]
        x, y = torch.tensor(s["x"][idx]), torch.tensor(s["y"][idx])
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x).flatten(0, -2), y.flatten())
        loss.backward()
        opt.step()
        want = r["losses"][k]
        if abs(loss.item() - want) > 1e-4 * abs(want):
            sys.exit(f"the PyTorch replica of {s['run']} is not the reference network: step {k + 1} loss {loss.item()} vs {want}")


def torch_step_ms(torch, s, steps):
    m = torch_model(torch, s)
    opt = torch_optimizer(torch, m, s["run"])
    m.train()
    rng = np.random.default_rng(0)
    n, b = len(s["x"]), s["batch"]
    batches = [rng.choice(n, b, replace=False) for _ in range(steps)]
    data = [(torch.tensor(s["x"][i]), torch.tensor(s["y"][i])) for i in batches]
    times = []
    for x, y in data:
        t = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x).flatten(0, -2), y.flatten())
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times[5:]) * 1e3


def kiln_step_ms(kiln, s, data_dir, steps, threads, device):
    model = os.path.join(TRAINING, s["run"], "model.onnx")
    cmd = [kiln, "train", model, "--data", data_dir, "--batch", str(s["batch"]), "--steps", str(steps),
           "--threads", str(threads), "--device", device, "--json"] + s["flags"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    steps_ms = [s["batch"] / r["samples_per_s"] * 1e3 for r in rows if "step" in r and "final" not in r]
    return statistics.median(steps_ms[5:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "target", "release", "kiln"))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", choices=["lenet", "gpt"])
    a = ap.parse_args()
    import torch
    torch.set_num_threads(a.threads)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith("Model name")), "?")
    print(f"# {model_name}, {os.cpu_count()} CPUs, torch {torch.__version__}, {a.threads} threads, Kiln on {a.device}")
    print("| model | Kiln ms/step | PyTorch ms/step | Kiln steps/s ÷ PyTorch's |")
    print("|---|---|---|---|")
    for name, s in setups().items():
        if a.only and name != a.only:
            continue
        check_replica(torch, s)
        with tempfile.TemporaryDirectory() as d:
            np.save(os.path.join(d, "x.npy"), s["x"])
            np.save(os.path.join(d, "y.npy"), s["y"])
            kiln, tor = [], []
            for _ in range(a.rounds):
                kiln.append(kiln_step_ms(a.kiln, s, d, a.steps, a.threads, a.device))
                tor.append(torch_step_ms(torch, s, a.steps))
        k, t = statistics.median(kiln), statistics.median(tor)
        print(f"| {s['run']} (batch {s['batch']}) | {k:.3f} | {t:.3f} | {t / k:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
