"""The offline judges (`sleuthd-bench robustness report|verify`) against the real server, on dialogues a test writes:
every cache `robustness embed` makes (embeddings, channels, narrowband copies, the clipped, noisy, composed and
telephone-band copies at the server's defaults, the clips' pitches and the copies moved in pitch, the clips' trimmed
lengths and the copies cut to a short turn's), then, instance by
instance, the offline judges must flag exactly what the server flags (and, with an intruder, exactly the
intruder)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .support import check_request, enc

# The server's channel-matching defaults, in judges.evidence_flags' order: band octaves, clip spread, noise dB, noise
# composed dB, telephone-band dB.
SERVER_MATCHING = (0.3, 0.005, 3.0, 6.0, -20.0)
SERVER_PITCH_OCTAVES = 0.25  # --pitch-match-octaves
SERVER_LENGTH_RATIO = 0.5  # --length-match-ratio


@dataclass
class Offline:
    instances: list[Any]  # sleuthd_bench.robustness.instances.Instance, S1/S2/S3 of every dialogue
    lines: dict[str, Any]  # dialogue id -> its manifest line
    blend: Any  # the fused encoder's EvidenceCalibration
    calibration: Any  # the fused encoder's Calibration
    pitch: Any  # sleuthd_bench.robustness.judges.PitchMatching at the server's default
    length: Any  # sleuthd_bench.robustness.judges.LengthMatching at the server's default


async def offline_judges(
    tmp_path: Path, models_dir: Path, clips: Mapping[str, bytes], lines: Sequence[Mapping[str, Any]]
) -> Offline:
    """Write the clips and a manifest of these dialogues (``eval-x.jsonl``) under tmp_path and make every cache."""
    from sleuthd.api import SpeakerEncoder
    from sleuthd.judgment.calibration import Calibration
    from sleuthd.judgment.evidence import EvidenceCalibration
    from sleuthd_bench.manifest import read_manifest
    from sleuthd_bench.robustness import embed
    from sleuthd_bench.robustness.cli import (
        _clipped_copies,
        _cut_copies,
        _pitched_copies,
        length_matching,
        pitch_matching,
    )
    from sleuthd_bench.robustness.instances import load_instances

    for name, data in clips.items():
        (tmp_path / name).write_bytes(data)
    manifest = tmp_path / "eval-x.jsonl"
    manifest.write_text("".join(json.dumps(dict(x)) + "\n" for x in lines))
    paths = embed.manifest_paths([manifest])

    def caches() -> tuple[list[Any], dict[str, Any]]:  # the tools' synchronous API, off the event loop
        embs = embed.embed_all(tmp_path, paths, models_dir=models_dir)
        hz, plateaus, snrs, lows = embed.measure_channels(tmp_path, paths)
        narrow = embed.embed_all(tmp_path, paths, models_dir=models_dir, narrowband=True)
        keys = _clipped_copies(tmp_path, [manifest], paths, *SERVER_MATCHING, None)
        embed.embed_all(tmp_path, keys, models_dir=models_dir, clipped=True)
        moved = _pitched_copies(tmp_path, [manifest], paths, SERVER_MATCHING, SERVER_PITCH_OCTAVES, None)
        embed.embed_all(tmp_path, moved, models_dir=models_dir, clipped=True)
        cut = _cut_copies(tmp_path, [manifest], paths, SERVER_MATCHING, SERVER_LENGTH_RATIO, models_dir, None)
        copies = embed.embed_all(tmp_path, cut, models_dir=models_dir, clipped=True)
        fused = SpeakerEncoder.load(models_dir, encoder="fused")
        fused.close()
        got = load_instances(tmp_path, "eval", ["x"], embs, hz, narrow, plateaus, copies, snrs, lows)
        return got, fused.manifest.raw

    instances, raw = await asyncio.to_thread(caches)
    pitch = pitch_matching(tmp_path, SERVER_PITCH_OCTAVES)
    length = length_matching(tmp_path, SERVER_LENGTH_RATIO)
    blend = EvidenceCalibration.from_manifest(raw)
    assert blend is not None
    by_id = {x.dialogue_id: x for x in read_manifest(manifest)}
    return Offline(instances, by_id, blend, Calibration.from_manifest(raw, "fused"), pitch, length)


async def assert_offline_flags_as_served(
    stub: pb_grpc.SleuthStub,
    tmp_path: Path,
    offline: Offline,
    check: Callable[[Any, pb.DialogueVerdict], None] = lambda inst, served: None,
) -> None:
    """Each instance sent to the server (speaker "B", its reference clip as audio): ``check`` its verdict, then the
    offline judges' flags must equal the server's, and under S2/S3 be the intruder alone."""
    from sleuthd_bench.instances import scenario_turns
    from sleuthd_bench.robustness import judges

    for inst in offline.instances:
        flags, _, _ = judges.evidence_flags(
            inst, offline.blend, offline.calibration, *SERVER_MATCHING, offline.pitch, offline.length
        )
        line = offline.lines[inst.dialogue_id]
        request = check_request([(tmp_path / p).read_bytes() for p in scenario_turns(line, inst.scenario)])
        request.references.add(speaker="B", audio=enc((tmp_path / line.reference).read_bytes()))
        served = await stub.CheckDialogue(request, timeout=120)
        check(inst, served)
        flagged = {k for k, t in enumerate(served.turns) if t.status == pb.INCONSISTENT}
        assert flags == flagged, (inst.dialogue_id, inst.scenario, flags, [(t.score, t.detail) for t in served.turns])
        if inst.scenario != "S1":
            assert flags == inst.gold  # the intruder is found, and nothing else
