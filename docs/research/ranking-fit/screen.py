"""Discrimination ordered by the candidates' fit (the verdict CheckDialogue's auto gives each in the slot) against
today's auto order (cosine to the context centroid), through the product's in-process API (sleuthd.api.Judge: the
server's own path minus the wire), on benchmark manifests (docs/benchmark-format.md).

    PYTHONPATH=service:tools:. python docs/research/ranking-fit/screen.py OUT.jsonl MANIFEST [MANIFEST ...]

Writes one line per discrimination instance (labels, centroid scores, fits); `summarise` prints the metrics.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from sleuthd.api import Judge
from sleuthd_bench.instances import discrimination_candidates, discrimination_context
from sleuthd_bench.manifest import read_manifest


def main(out: str, manifests: list[str]) -> None:
    judge = Judge.load()
    done = set()
    if Path(out).exists():
        done = {(r["manifest"], r["dialogue_id"]) for r in map(json.loads, Path(out).read_text().splitlines())}
    with open(out, "a") as f:
        for manifest in manifests:
            base = Path(manifest).parent
            lines = read_manifest(Path(manifest), check_audio=False)
            t0 = time.perf_counter()
            for n, line in enumerate(lines):
                if (manifest, line.dialogue_id) in done:
                    continue
                candidates = discrimination_candidates(line, 0)
                ranked = judge.rank(
                    {c.candidate_id: (base / c.path).read_bytes() for c in candidates},
                    context=[(base / rel).read_bytes() for rel in discrimination_context(line)],
                    reference=(base / line.reference).read_bytes(),
                    speaker=line.target_speaker,
                    method="auto",
                    encoder="fused",
                )
                by_id = {c.candidate_id: c for c in ranked.candidates}
                row = {
                    "manifest": manifest,
                    "dialogue_id": line.dialogue_id,
                    "source": line.source,
                    "labels": [c.label for c in candidates],
                    "scores": [by_id[c.candidate_id].score for c in candidates],
                    "fits": [by_id[c.candidate_id].fit_probability for c in candidates],
                    "statuses": [by_id[c.candidate_id].fit_status for c in candidates],
                }
                f.write(json.dumps(row) + "\n")
                f.flush()
                if n % 20 == 0:
                    print(f"{manifest}: {n}/{len(lines)} {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    judge.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
