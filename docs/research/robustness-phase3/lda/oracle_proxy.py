"""Screen: does a within-speaker (nuisance) projection learned on the matrix's TRAIN voices make each encoder's
hindsight oracle better on the EVAL voices? A cheap proxy, before any refit of the served judgment.

Transform per encoder: WCCN, z = (S_w + a * mean(eig S_w) * I)^(-1/2) x, renormalised, S_w the pooled within-speaker
covariance of the train split's clips (every condition but FSDD, optionally without the sox conditions), each
speaker id's clips centred on their own mean. Reported: per eval condition, the best hindsight Bal of each paper
method on raw and on transformed embeddings, per encoder.

Run from the repository root: PYTHONPATH=service:tools:. python docs/research/robustness-phase3/lda/oracle_proxy.py
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.cli import _conditions, _load_all
from sleuthd_bench.robustness.embed import ENCODERS, load

ROOT = Path("data/robustness")
EVAL_ROOT = ROOT


def labelled_paths(split: str, exclude: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in sorted(ROOT.glob(f"{split}-*.jsonl")):
        cond = f.stem[len(split) + 1 :]
        if any(cond.startswith(x) for x in exclude):
            continue
        for line in f.read_text().splitlines():
            d = json.loads(line)
            m = d["meta"]
            for p in [d.get("reference"), *d["target_turns"]]:
                if p:
                    out[p] = d["target_speaker"]
            if d.get("s2_audio"):
                out[d["s2_audio"]] = m["s2_speaker"]
            if d.get("s3_audio"):
                out[d["s3_audio"]] = m["s3_speaker"]
    return out


def within_cov(emb, labels):
    X, y = [], []
    for p, s in labels.items():
        v, _ = emb.get(p)
        if v is not None:
            X.append(v.astype(np.float64))
            y.append(s)
    X, y = np.array(X), np.array(y)
    C = np.zeros((X.shape[1], X.shape[1]))
    n = 0
    for s in np.unique(y):
        xs = X[y == s]
        if len(xs) < 2:
            continue
        d = xs - xs.mean(0)
        C += d.T @ d
        n += len(xs) - 1
    return C / n, len(np.unique(y)), len(X)


def transform_of(C, alpha):
    w, V = np.linalg.eigh(C)
    w = np.maximum(w, 0) + alpha * w.mean()
    return (V / np.sqrt(w)) @ V.T


def apply(v, T):
    if v is None:
        return None
    z = (v.astype(np.float64) @ T).astype(np.float32)
    return z / np.linalg.norm(z, axis=-1, keepdims=True)


def whiten_views(views, Ts):
    """``views`` (encoder -> Turns) with each encoder of ``Ts`` transformed; encoders absent or unusable as they were."""
    if not views:
        return views
    out = dict(views)
    for e, T in Ts.items():
        if e in out and out[e] is not None:
            t = out[e]
            out[e] = replace(t, emb=apply(t.emb, T) if len(t.emb) else t.emb, reference=apply(t.reference, T))
    return out


def transformed(inst, Ts):
    return replace(inst, views=whiten_views(inst.views, Ts))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--alphas", default="0.1,0.3,1,3")
    ap.add_argument("--exclude", default="f-", help="comma-separated condition prefixes left out of the fit")
    ap.add_argument("--eval-root", type=Path, default=ROOT, help="where the judged split lives (data/devlarge: dev)")
    ap.add_argument("--conditions", help="comma-separated conditions judged (default: all of the eval split)")
    args = ap.parse_args()
    exclude = tuple(x for x in args.exclude.split(",") if x)
    embs = {e: load(ROOT, e) for e in ENCODERS}
    labels = labelled_paths("train", exclude)
    covs = {}
    for e in ENCODERS:
        C, ns, nx = within_cov(embs[e], labels)
        covs[e] = C
        w = np.linalg.eigvalsh(C)
        print(f"{e}: {nx} train clips of {ns} speaker ids; S_w eigenvalues max/mean {w.max() / w.mean():.1f}, "
              f"trace {w.sum():.3f}", flush=True)
    names = args.conditions.split(",") if args.conditions else [
        n for n in _conditions(None) if (args.eval_root / f"eval-{n}.jsonl").is_file()]
    _, insts = _load_all(args.eval_root, "eval", names)
    alphas = [float(a) for a in args.alphas.split(",")]
    by = {}
    for inst in insts:
        by.setdefault(inst.condition, []).append(inst)
    head = " | ".join(f"a={a:g}" for a in alphas)
    print(f"\nexclude from fit: {exclude}\n")
    print(f"| condition | encoder | raw best (method) | {head} |")
    print("| :--- | :--- | :--- | " + " | ".join("---:" for _ in alphas) + " |")
    sums = {e: np.zeros(len(alphas) + 1) for e in ENCODERS}
    best_any = np.zeros(len(alphas) + 1)
    for c in names:
        row_best = np.full(len(alphas) + 1, -1.0)
        for e in ENCODERS:
            raw = max((judges.oracle(by[c], e, m) for m in judges.PAPER), key=lambda o: o.bal if o else -1)
            vals = [raw.bal]
            for a in alphas:
                T = transform_of(covs[e], a)
                ti = [transformed(i, {e: T}) for i in by[c]]
                o = max((judges.oracle(ti, e, m) for m in judges.PAPER), key=lambda o: o.bal if o else -1)
                vals.append(o.bal)
            sums[e] += vals
            row_best = np.maximum(row_best, vals)
            print(f"| {c} | {e} | {raw.bal:.1f} ({raw.method}) | " + " | ".join(f"{v:.1f}" for v in vals[1:]) + " |",
                  flush=True)
        best_any += row_best
    for e in ENCODERS:
        print(f"| mean of {len(names)} | {e} | {sums[e][0] / len(names):.2f} | "
              + " | ".join(f"{v / len(names):.2f}" for v in sums[e][1:]) + " |")
    print(f"| mean of {len(names)} | best of encoders | {best_any[0] / len(names):.2f} | "
          + " | ".join(f"{v / len(names):.2f}" for v in best_any[1:]) + " |")


if __name__ == "__main__":
    main()
