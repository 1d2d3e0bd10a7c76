"""Replaying a benchmark manifest through a running server (``sleuthd-bench replay``).

Every instance goes through the public gRPC API, exactly as a user's pipeline would call it:
one ``CheckDialogue`` per detection instance and run, one ``RankCandidates`` per discrimination
instance and method (ranking does not depend on thresholds, so ``pairwise@paper`` and
``pairwise@default`` share it). Requests run with bounded concurrency; UNAVAILABLE is retried;
an instance whose call still fails is left out of the metrics and listed in the failure summary.

Outputs in the report folder: ``report.json`` (schema of docs/benchmark-format.md), ``report.md``,
``predictions.jsonl``, ``sweep.json``, ``threshold_sweep.png``, ``bias_scatter.png``,
``replay.json`` (what was run, against what, how long it took and what failed) and, when ``auto``
was replayed, ``calibration.json``, ``reliability.png`` and ``comparison.json`` (auto against every
other run, paired over the same dialogues, with bootstrap intervals). When ``lalm`` (the server's LALM
judge) was replayed: ``calibration_lalm.json`` and ``reliability_lalm.png`` (are the judge's probabilities
probabilities?), the judge's description in ``replay.json`` and ``report.md``, and the judge's per-turn
fields in ``predictions.jsonl``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
from sleuthd import client
from sleuthd.v1 import sleuthd_pb2 as pb

from sleuthd_bench import paired
from sleuthd_bench import report as report_mod
from sleuthd_bench.instances import (
    AUTO,
    LALM,
    PAPER_METHODS,
    Candidate,
    Run,
    discrimination_candidates,
    discrimination_context,
    gold_turns,
    plan_runs,
    scenario_turns,
)
from sleuthd_bench.manifest import ManifestLine, read_manifest
from sleuthd_bench.metrics import SCENARIOS, DetectionRecord, DiscriminationRecord, Scenario, method_report
from sleuthd_bench.progress import Progress
from sleuthd_bench.sweeps import SWEEPS, SweepInstance, best_table, held_out, held_out_table, sweep_method

logger = logging.getLogger(__name__)

AUTO_ENUM = "METHOD_AUTO"
# Methods the API names by enum value: sent by name, since older API versions lack them.
_ENUM_OF = {AUTO: AUTO_ENUM, LALM: "METHOD_LALM"}
_STATUS = {v: k for k, v in pb.TurnStatus.items()}
# After this many calls in a row fail with UNAVAILABLE (retries included) the server is taken to be
# gone: the remaining instances are not sent, instead of each waiting out its own retries.
_GIVE_UP_AFTER_UNAVAILABLE = 8
_SHOWN_MESSAGES = 3


class ReplayError(RuntimeError):
    """The replay cannot start or finish (server unreachable, bad options); the message says why."""


@dataclass(frozen=True)
class ReplayConfig:
    """Options of ``sleuthd-bench replay``.

    ``methods``: from pairwise, centroid, reference, auto, lalm. ``thresholds``: from paper, default.
    ``concurrency``: RPCs in flight at once. ``timeout_s``: deadline of each RPC.
    ``connect_timeout_s``: how long to wait for the server before giving up.
    ``shuffle_seed``: seeds the candidate order of every discrimination instance.
    ``encoder``: the server encoder to use (``""`` = the server's default).
    ``busy_retries``: how many times an RPC the server refused as busy (RESOURCE_EXHAUSTED, which the server keeps
    for "busy, retry later": sleuthd.rpc.status) is sent again, after 0.5, 1, 2, 4, 8, 8... s (jittered), before it
    is recorded as failed; 0 = never.
    """

    manifest: Path
    target: str
    out_dir: Path
    methods: tuple[str, ...] = PAPER_METHODS
    thresholds: tuple[str, ...] = ("paper", "default")
    concurrency: int = 4
    timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    shuffle_seed: int = 0
    encoder: str = ""
    show_progress: bool = True
    busy_retries: int = 6


@dataclass(frozen=True)
class Failure:
    """An instance whose RPC failed; ``task`` is S1/S2/S3 or ``discrimination``."""

    run: str
    dialogue_id: str
    task: str
    code: str
    message: str


@dataclass(frozen=True)
class DetectionOutcome:
    record: DetectionRecord
    judged: bool
    encoder: str
    turns: list[dict[str, Any]]  # per turn: status, score, threshold and the three paper scores


@dataclass(frozen=True)
class RankOutcome:
    candidates: list[Candidate]  # presentation order
    scores: list[float]  # presentation order
    higher_is_better: bool
    server_order: list[str]  # labels, best first, as the server ranked them
    encoder: str


@dataclass
class ReplayResult:
    report: dict[str, Any]
    written: dict[str, Path]
    failures: list[Failure]
    wall_s: float
    rpcs: int  # RPCs sent, retries included
    sweeps: dict[str, dict[str, Any]] = field(default_factory=dict)
    incomplete_runs: list[str] = field(default_factory=list)
    busy_retries: int = 0  # RPCs sent again after the server refused them as busy

    def failure_summary(self) -> str:
        return failure_summary(self.failures)


def failure_summary(failures: Sequence[Failure]) -> str:
    """Failures per status code with the first few messages; empty string when nothing failed."""
    if not failures:
        return ""
    by_code = Counter(f.code for f in failures)
    lines = [f"{len(failures)} instance(s) failed and are left out of the metrics:"]
    for code, count in by_code.most_common():
        lines.append(f"  {code}: {count}")
        for f in [f for f in failures if f.code == code][:_SHOWN_MESSAGES]:
            lines.append(f"    {f.run} {f.dialogue_id} {f.task}: {f.message}")
    return "\n".join(lines)


def check_auto_supported(methods: Sequence[str]) -> None:
    for method, enum in _ENUM_OF.items():
        if method in methods and enum not in pb.Method.keys():
            raise ReplayError(f"this server/client has no {method} method (sleuthd.v1 has no {enum})")


def _options(run_method: str, thresholds: str | None, encoder: str) -> pb.CheckOptions:
    if run_method in _ENUM_OF:
        # By name: the enum value only exists in API versions that have the method.
        return pb.CheckOptions(encoder=encoder, method=_ENUM_OF[run_method])
    return client.make_options(run_method, thresholds, encoder=encoder)


def _judge_fields(t: Any) -> dict[str, Any]:
    """A lalm verdict's judge fields (none for other methods, so their predictions stay as they were)."""
    if not t.HasField("judge_probability"):
        return {}
    return {
        "judge_probability": t.judge_probability,
        "judge_answer_mass": _opt(t, "judge_answer_mass"),
        "judge_calibrated": t.judge_calibrated,
    }


def judge_description(info: pb.GetServerInfoResponse) -> dict[str, Any] | None:
    """The server's LALM judge as replay.json and report.md show it; None when it has none."""
    if not info.HasField("judge"):
        return None
    j = info.judge
    return {
        "model": j.model_name,
        "backend": j.backend,
        "architecture": j.architecture,
        "dtype": j.dtype,
        "weights_sha256": j.weights_sha256,
        "calibrated_detection": j.calibrated_detection,
        "calibrated_discrimination": j.calibrated_discrimination,
        "prompt_version": j.prompt_version,
        "decision_threshold": j.decision_threshold,
    }


def _opt(msg: Any, name: str) -> float | None:
    return float(getattr(msg, name)) if msg.HasField(name) else None


class _Replayer:
    """Holds one replay's state: the stub, the manifest folder and the failure bookkeeping."""

    def __init__(self, stub: Any, base: Path, config: ReplayConfig) -> None:
        self.stub = stub
        self.base = base
        self.config = config
        self.failures: list[Failure] = []
        self.unavailable_streak = 0
        self.gave_up = False
        self.rpcs = 0
        self.busy_retries = 0  # RPCs sent again after a busy refusal

    def audio(self, rel: str) -> pb.Audio:
        return pb.Audio(encoded=(self.base / rel).read_bytes())

    async def call(self, run: str, dialogue_id: str, task: str, rpc: Callable[[], Awaitable[Any]]) -> Any | None:
        """Run one RPC (the channel retries UNAVAILABLE; a busy refusal is sent again here, ``busy_retries`` times);
        on failure record it and return None."""
        if self.gave_up:
            self.failures.append(
                Failure(run, dialogue_id, task, "NOT_SENT", "skipped: the server stopped answering (UNAVAILABLE)")
            )
            return None
        for attempt in range(max(self.config.busy_retries, 0) + 1):
            self.rpcs += 1
            try:
                result = await rpc()
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and attempt < max(self.config.busy_retries, 0):
                    # Busy: back off (jittered, so refused calls do not all come back at once) and send it again.
                    self.busy_retries += 1
                    await asyncio.sleep(min(0.5 * 2**attempt, 8.0) * random.uniform(0.5, 1.5))
                    continue
                self._failed(run, dialogue_id, task, exc)
                return None
            except OSError as exc:  # a file vanished or became unreadable during the run
                self.failures.append(Failure(run, dialogue_id, task, "CLIENT_IO", str(exc)))
                return None
            self.unavailable_streak = 0
            return result
        return None

    def _failed(self, run: str, dialogue_id: str, task: str, exc: grpc.aio.AioRpcError) -> None:
        """Record a failed RPC; many UNAVAILABLE in a row stop the replay from sending more."""
        self.failures.append(Failure(run, dialogue_id, task, exc.code().name, exc.details() or ""))
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            self.unavailable_streak += 1
            if self.unavailable_streak >= _GIVE_UP_AFTER_UNAVAILABLE and not self.gave_up:
                self.gave_up = True
                logger.error("%d calls in a row failed with UNAVAILABLE: giving up", self.unavailable_streak)

    async def detect(self, line: ManifestLine, run: Run, scenario: Scenario) -> DetectionOutcome | None:
        turns = scenario_turns(line, scenario)
        speaker = line.target_speaker
        req = pb.CheckDialogueRequest(
            dialogue_id=f"{line.dialogue_id}/{scenario}",
            options=_options(run.method, run.thresholds, self.config.encoder),
        )
        try:
            for i, rel in enumerate(turns):
                req.turns.add(turn_id=str(i), speaker=speaker, audio=self.audio(rel))
            # Always sent: it lets every turn carry reference_cosine, whatever the method.
            req.references.add(speaker=speaker, audio=self.audio(line.reference))
        except OSError as exc:
            self.failures.append(Failure(run.name, line.dialogue_id, scenario, "CLIENT_IO", str(exc)))
            return None
        verdict = await self.call(
            run.name,
            line.dialogue_id,
            scenario,
            lambda: self.stub.CheckDialogue(req, timeout=self.config.timeout_s),
        )
        if verdict is None:
            return None
        sv = next((s for s in verdict.speakers if s.speaker == speaker), None)
        judged = bool(sv is not None and sv.judged)
        flagged = frozenset(int(t) for t in sv.inconsistent_turn_ids) if sv is not None else frozenset()
        by_id = {t.turn_id: t for t in verdict.turns}
        per_turn: list[dict[str, Any]] = []
        for i in range(len(turns)):
            t = by_id.get(str(i))
            if t is None:
                per_turn.append({"status": "MISSING"})
                continue
            per_turn.append(
                {
                    "status": _STATUS.get(t.status, str(t.status)),
                    "score": _opt(t, "score"),
                    "threshold": _opt(t, "threshold"),
                    "pairwise_mean_cosine": _opt(t, "pairwise_mean_cosine"),
                    "centroid_cosine_distance": _opt(t, "centroid_cosine_distance"),
                    "reference_cosine": _opt(t, "reference_cosine"),
                    "speech_seconds": round(t.speech_seconds, 3),
                    **_judge_fields(t),
                }
            )
        record = DetectionRecord(
            dialogue_id=line.dialogue_id,
            source=line.source,
            scenario=scenario,
            gold_turns=gold_turns(line, scenario),
            pred_turns=flagged,
            # Flagged means an INCONSISTENT turn: an UNCERTAIN one is neither flagged nor cleared, and counts
            # as not flagged in the paper's metrics (its rate is reported apart).
            pred_inconsistent=judged and bool(flagged),
        )
        return DetectionOutcome(record, judged, verdict.encoder, per_turn)

    async def rank(self, line: ManifestLine, method: str) -> RankOutcome | None:
        candidates = discrimination_candidates(line, self.config.shuffle_seed)
        req = pb.RankCandidatesRequest(speaker=line.target_speaker, options=_options(method, None, self.config.encoder))
        try:
            for rel in discrimination_context(line):
                req.context.append(self.audio(rel))
            req.reference.CopyFrom(self.audio(line.reference))
            for c in candidates:
                req.candidates.add(candidate_id=c.candidate_id, audio=self.audio(c.path))
        except OSError as exc:
            self.failures.append(Failure(method, line.dialogue_id, "discrimination", "CLIENT_IO", str(exc)))
            return None
        resp = await self.call(
            method,
            line.dialogue_id,
            "discrimination",
            lambda: self.stub.RankCandidates(req, timeout=self.config.timeout_s),
        )
        if resp is None:
            return None
        by_id = {c.candidate_id: c for c in resp.candidates}
        missing = [c.candidate_id for c in candidates if c.candidate_id not in by_id]
        if missing:
            self.failures.append(
                Failure(method, line.dialogue_id, "discrimination", "BAD_RESPONSE", f"no score for {missing}")
            )
            return None
        label = {c.candidate_id: c.label for c in candidates}
        return RankOutcome(
            candidates=candidates,
            scores=[float(by_id[c.candidate_id].score) for c in candidates],
            higher_is_better=bool(resp.candidates[0].higher_is_better),
            server_order=[label[c.candidate_id] for c in resp.candidates],
            encoder=resp.encoder,
        )


async def _connect(ch: grpc.aio.Channel, stub: Any, config: ReplayConfig) -> pb.GetServerInfoResponse:
    try:
        await asyncio.wait_for(ch.channel_ready(), timeout=config.connect_timeout_s)
    except TimeoutError:
        raise ReplayError(
            f"cannot reach a sleuthd server at {config.target} (no connection within "
            f"{config.connect_timeout_s:g} s): is it running? Start one with `sleuthd serve`, "
            "or pass --target HOST:PORT"
        ) from None
    try:
        info: pb.GetServerInfoResponse = await stub.GetServerInfo(
            pb.GetServerInfoRequest(), timeout=config.connect_timeout_s
        )
    except grpc.aio.AioRpcError as exc:
        raise ReplayError(
            f"{config.target} does not answer GetServerInfo: {exc.code().name}: {exc.details()}"
        ) from None
    return info


def _encoder_info(info: pb.GetServerInfoResponse, name: str) -> pb.EncoderInfo | None:
    wanted = name or info.default_encoder
    return next((e for e in info.encoders if e.name == wanted), None)


async def replay(config: ReplayConfig) -> ReplayResult:
    """Replay ``config.manifest`` against ``config.target`` and write the report folder.

    Raises :class:`ManifestError` for a bad manifest (before any RPC) and :class:`ReplayError` when
    the server cannot be reached or the options cannot be served. Failed instances do not raise:
    they are in ``ReplayResult.failures``.
    """
    started = time.monotonic()
    if config.concurrency < 1:
        raise ReplayError(f"--concurrency must be at least 1, got {config.concurrency}")
    check_auto_supported(config.methods)
    lines = read_manifest(config.manifest)
    runs = plan_runs(config.methods, config.thresholds)

    async with client.channel(config.target) as ch:
        stub = client.stub(ch)
        info = await _connect(ch, stub, config)
        if LALM in config.methods and not info.HasField("judge"):
            raise ReplayError(
                f"the server at {config.target} has no LALM judge, so --methods lalm cannot run: start it with "
                "--judge-model DIR or --judge-endpoint URL --judge-model-name NAME (docs/judge.md)"
            )
        replayer = _Replayer(stub, Path(config.manifest).parent, config)
        detections, rankings = await _send_all(replayer, lines, runs)

    encoders = [o.encoder for o in detections.values() if o.encoder] + [o.encoder for o in rankings.values()]
    encoder = encoders[0] if encoders else (config.encoder or info.default_encoder)
    if len(set(encoders)) > 1:
        logger.warning("responses name several encoders (%s); the report names %s", sorted(set(encoders)), encoder)
    unjudged = sum(1 for o in detections.values() if not o.judged)
    if unjudged:
        logger.warning("%d detection instance(s) had no scorable turn and count as 'consistent'", unjudged)

    methods_report: dict[str, dict[str, Any]] = {}
    incomplete: list[str] = []
    predictions: list[dict[str, Any]] = []
    records_by_run: dict[str, list[DetectionRecord]] = {}
    for run in runs:
        det = [detections[k].record for k in _keys(lines, run.name) if k in detections]
        disc = [
            _discrimination_record(line, rankings[(run.method, line.dialogue_id)], run.method)
            for line in lines
            if (run.method, line.dialogue_id) in rankings
        ]
        try:
            methods_report[run.name] = method_report(det, disc or None)
            records_by_run[run.name] = det
        except ValueError as exc:
            logger.error("run %s has too few answered instances to score: %s", run.name, exc)
            incomplete.append(run.name)
        predictions.extend(_predictions(lines, run, detections, rankings))

    report = report_mod.build_report(Path(config.manifest).name, len(lines), encoder, methods_report)
    sweeps = _sweeps(lines, detections)
    enc_info = _encoder_info(info, encoder)
    # Proto maps have no order: sorted, so the same server gives the same bytes in sweep.json.
    defaults = dict(sorted(enc_info.default_thresholds.items())) if enc_info is not None else {}
    out_dir = Path(config.out_dir)
    written = report_mod.write_report(
        out_dir,
        report,
        {m: s["curve"] for m, s in sweeps.items()},
        predictions,
        sweep_defaults={m: defaults[m] for m in sweeps if m in defaults},
    )
    comparisons: list[paired.PairedComparison] = []
    by_speaker: list[paired.PairedComparison] = []
    judge = judge_description(info) if any(run.method == LALM for run in runs) else None
    if judge is not None:
        written.update(_write_reliability(out_dir, predictions, Path(config.manifest).name, LALM))
    if any(run.method == AUTO for run in runs):
        written.update(_write_reliability(out_dir, predictions, Path(config.manifest).name))
        comparisons = _compare_auto(records_by_run)
        # Beside it, over target speakers where speakers have several dialogues: those dialogues usually reuse the
        # speaker's clips, so they are not independent draws (sleuthd_bench.paired, groups).
        speakers = {line.dialogue_id: line.target_speaker for line in lines}
        if comparisons and len(set(speakers.values())) < len(speakers):
            by_speaker = _compare_auto(records_by_run, speakers)
        if comparisons:
            doc: dict[str, Any] = {"manifest": Path(config.manifest).name}
            doc["comparisons"] = [c.to_json() for c in comparisons]
            if by_speaker:
                doc["comparisons_by_speaker"] = [c.to_json() for c in by_speaker]
            written["comparison"] = _write_json(out_dir / "comparison.json", doc)
    wall_s = time.monotonic() - started
    failures = replayer.failures
    marks = {"paper": dict(sorted(info.paper_thresholds.items())), "default": defaults}
    sweep_doc = {
        "manifest": Path(config.manifest).name,
        "encoder": encoder,
        "source_runs": {m: f"{m}@paper" for m in sweeps},
        "paper_thresholds": marks["paper"],
        "default_thresholds": defaults,
        "methods": sweeps,
    }
    written["sweep"] = _write_json(out_dir / "sweep.json", sweep_doc)
    written["replay"] = _write_json(
        out_dir / "replay.json",
        {
            "manifest": str(config.manifest),
            "target": config.target,
            "server_version": info.version,
            "encoder": encoder,
            "runs": [r.name for r in runs],
            **({"judge": judge} if judge is not None else {}),
            "incomplete_runs": incomplete,
            "n_dialogues": len(lines),
            "rpcs": replayer.rpcs,
            "busy_retries": replayer.busy_retries,
            "concurrency": config.concurrency,
            "wall_seconds": round(wall_s, 2),
            "failures": {
                "count": len(failures),
                "by_code": dict(Counter(f.code for f in failures)),
                "instances": [asdict(f) for f in failures],
            },
        },
    )
    _append_markdown(
        written["report_md"],
        sweeps,
        marks,
        comparisons,
        failures,
        incomplete,
        wall_s,
        replayer.rpcs,
        judge,
        by_speaker,
    )
    return ReplayResult(report, written, failures, wall_s, replayer.rpcs, sweeps, incomplete, replayer.busy_retries)


_Job = Callable[[], Awaitable[None]]


async def _send_all(
    replayer: _Replayer, lines: Sequence[ManifestLine], runs: Sequence[Run]
) -> tuple[dict[tuple[str, str, str], DetectionOutcome], dict[tuple[str, str], RankOutcome]]:
    """Every RPC of the replay; returns the answered detections and rankings by instance key."""
    detections: dict[tuple[str, str, str], DetectionOutcome] = {}
    rankings: dict[tuple[str, str], RankOutcome] = {}
    rank_methods = list(dict.fromkeys(r.method for r in runs))
    concurrency = replayer.config.concurrency

    # Per dialogue, the first ranking call goes alone: it carries every clip of the dialogue
    # (context, reference, original, S2, S3), so the server embeds each clip once, in one batch,
    # and the dialogue's other calls all hit its embedding cache. Sent together instead, the
    # first few calls would all miss the cache and embed the same clips in parallel.
    # At most `concurrency` dialogues are open at once, which keeps the working set small
    # enough for the server's cache however long the manifest is.
    groups: list[tuple[_Job, list[_Job]]] = []
    for line in lines:
        primer = _rank_job(replayer, rankings, line, rank_methods[0])
        rest = [_rank_job(replayer, rankings, line, m) for m in rank_methods[1:]]
        rest += [_detect_job(replayer, detections, line, r, s) for r in runs for s in SCENARIOS]
        groups.append((primer, rest))

    rpc_slots = asyncio.Semaphore(concurrency)
    dialogue_slots = asyncio.Semaphore(concurrency)
    bar = Progress(sum(1 + len(rest) for _, rest in groups), "replay", enabled=replayer.config.show_progress)

    async def bounded(job: _Job) -> None:
        async with rpc_slots:
            await job()
        bar.advance()

    async def dialogue(primer: _Job, rest: list[_Job]) -> None:
        async with dialogue_slots:
            await bounded(primer)
            await asyncio.gather(*(bounded(j) for j in rest))

    with bar:
        await asyncio.gather(*(dialogue(primer, rest) for primer, rest in groups))
    return detections, rankings


def _discrimination_record(line: ManifestLine, outcome: RankOutcome, method: str) -> DiscriminationRecord:
    """The instance as the metrics read it: the candidates' scores, except under auto, which ranks the candidates
    the gate would pass first (RankedCandidate.fit_status) and so is not ordered by its score alone: there the
    server's order is what is scored (its rank, as a score)."""
    labels = tuple(c.label for c in outcome.candidates)
    if method == AUTO:
        ranks = tuple(-float(outcome.server_order.index(label)) for label in labels)
        return DiscriminationRecord(line.dialogue_id, line.source, labels, ranks, higher_is_better=True)
    return DiscriminationRecord(
        dialogue_id=line.dialogue_id,
        source=line.source,
        labels=labels,
        scores=tuple(outcome.scores),
        higher_is_better=outcome.higher_is_better,
    )


def _keys(lines: Sequence[ManifestLine], run_name: str) -> list[tuple[str, str, str]]:
    return [(run_name, line.dialogue_id, s) for line in lines for s in SCENARIOS]


def _detect_job(
    replayer: _Replayer,
    out: dict[tuple[str, str, str], DetectionOutcome],
    line: ManifestLine,
    run: Run,
    scenario: Scenario,
) -> _Job:
    async def job() -> None:
        outcome = await replayer.detect(line, run, scenario)
        if outcome is not None:
            out[(run.name, line.dialogue_id, scenario)] = outcome

    return job


def _rank_job(replayer: _Replayer, out: dict[tuple[str, str], RankOutcome], line: ManifestLine, method: str) -> _Job:
    async def job() -> None:
        outcome = await replayer.rank(line, method)
        if outcome is not None:
            out[(method, line.dialogue_id)] = outcome

    return job


def _predictions(
    lines: Sequence[ManifestLine],
    run: Run,
    detections: dict[tuple[str, str, str], DetectionOutcome],
    rankings: dict[tuple[str, str], RankOutcome],
) -> list[dict[str, Any]]:
    """One object per answered instance of ``run``, in manifest order (S1, S2, S3, discrimination)."""
    out: list[dict[str, Any]] = []
    for line in lines:
        for scenario in SCENARIOS:
            d = detections.get((run.name, line.dialogue_id, scenario))
            if d is None:
                continue
            out.append(
                {
                    "run": run.name,
                    "dialogue_id": line.dialogue_id,
                    "source": line.source,
                    "scenario": scenario,
                    "gold_inconsistent": d.record.gold_inconsistent,
                    "pred_inconsistent": d.record.pred_inconsistent,
                    "gold_turns": sorted(d.record.gold_turns),
                    "pred_turns": sorted(d.record.pred_turns),
                    "judged": d.judged,
                    "turns": d.turns,
                }
            )
        r = rankings.get((run.method, line.dialogue_id))
        if r is None:
            continue
        out.append(
            {
                "run": run.name,
                "dialogue_id": line.dialogue_id,
                "source": line.source,
                "scenario": "discrimination",
                "candidate_ids": [c.candidate_id for c in r.candidates],
                "labels": [c.label for c in r.candidates],
                "scores": r.scores,
                "higher_is_better": r.higher_is_better,
                "pred_order": r.server_order,
                "pred": r.server_order[0],
            }
        )
    return out


def _sweeps(
    lines: Sequence[ManifestLine], detections: dict[tuple[str, str, str], DetectionOutcome]
) -> dict[str, dict[str, Any]]:
    """Sweep each paper method over the per-turn scores of its ``@paper`` run (always replayed), with how its best
    threshold carries to target speakers it was not chosen on (``held_out``, where the manifest names 4 or more)."""
    speakers = {f"{line.dialogue_id}/{scenario}": line.target_speaker for line in lines for scenario in SCENARIOS}
    out: dict[str, dict[str, Any]] = {}
    for method in PAPER_METHODS:
        instances = []
        for line in lines:
            for scenario in SCENARIOS:
                d = detections.get((f"{method}@paper", line.dialogue_id, scenario))
                if d is None:
                    continue
                scores = {
                    spec.score_field: [
                        math.nan if t.get(spec.score_field) is None else float(t[spec.score_field]) for t in d.turns
                    ]
                    for spec in SWEEPS.values()
                }
                instances.append(SweepInstance(f"{line.dialogue_id}/{scenario}", scenario, d.record.gold_turns, scores))
        try:
            out[method] = sweep_method(method, instances)
        except ValueError as exc:
            logger.error("no threshold sweep for %s: %s", method, exc)
            continue
        carried = held_out(method, instances, speakers)
        if carried is not None:
            out[method]["held_out"] = carried
    return out


def _write_json(path: Path, obj: Any) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def _compare_auto(
    records_by_run: dict[str, list[DetectionRecord]], speakers: dict[str, str] | None = None
) -> list[paired.PairedComparison]:
    """auto against every other scored run, over dialogues (or, with ``speakers``, over whole target speakers); none
    when auto itself could not be scored."""
    if AUTO not in records_by_run:
        return []
    try:
        return paired.compare_with_all(records_by_run, AUTO, groups=speakers)
    except ValueError as exc:  # e.g. no dialogue answered by both in all three scenarios
        logger.error("no paired comparison with auto: %s", exc)
        return []


def _append_markdown(
    path: Path,
    sweeps: dict[str, dict[str, Any]],
    marks: dict[str, dict[str, float]],
    comparisons: Sequence[paired.PairedComparison],
    failures: Sequence[Failure],
    incomplete: Sequence[str],
    wall_s: float,
    rpcs: int,
    judge: dict[str, Any] | None = None,
    by_speaker: Sequence[paired.PairedComparison] = (),
) -> None:
    parts = [""]
    if judge is not None:
        calibrated = "calibrated" if judge["calibrated_detection"] else "uncalibrated (raw answer shares)"
        parts += [
            "## The LALM judge (run `lalm`)",
            "",
            f"{judge['model']} ({judge['backend']}{', ' + judge['architecture'] if judge['architecture'] else ''}), "
            f"prompt version {judge['prompt_version']}, detection {calibrated}; a turn is flagged when the judge's "
            f"probability of a different speaker is above {judge['decision_threshold']:g}. Reliability of its "
            "probabilities: `calibration_lalm.json`, `reliability_lalm.png`.",
            "",
        ]
    if sweeps:
        parts += [
            "## Threshold sweep",
            "",
            "Best thresholds over the per-turn paper scores of each method's `@paper` run "
            "(ties: middle of the plateau). Curves in `sweep.json` and `threshold_sweep.png`.",
            "",
            best_table(sweeps, marks),
        ]
        carried = held_out_table(sweeps)
        if carried:
            parts += [
                "### The best threshold, held out over target speakers",
                "",
                "The best thresholds above are chosen on these very dialogues, in hindsight. Here each is chosen on "
                "a random half of the target speakers and measured on the other half, over 20 seeded halvings. The "
                "first Bal column estimates what a threshold tuned on labelled speakers does on new ones (tuned on "
                "half of these); beside it is the other half's own best, and the gap between the two is hindsight.",
                "",
                carried,
            ]
    if comparisons:
        parts += [
            "## auto against each run, paired",
            "",
            paired.explanation(comparisons),
            "",
            paired.markdown_table(comparisons),
        ]
    if by_speaker:
        parts += [
            "### The same over target speakers",
            "",
            "A speaker's dialogues usually reuse its clips, so they are not independent draws: here whole speakers "
            "are resampled. Where the two intervals differ, read this one. " + paired.explanation(by_speaker),
            "",
            paired.markdown_table(by_speaker),
        ]
    parts += ["## Failures", ""]
    if failures or incomplete:
        parts += ["```", failure_summary(failures), "```", ""]
        if incomplete:
            parts += [f"Runs left out (too few answered instances): {', '.join(incomplete)}", ""]
    else:
        parts += ["None: every instance was answered.", ""]
    parts += [f"Replay: {rpcs} RPCs in {wall_s:.1f} s wall time.", ""]
    with path.open("a", encoding="utf-8") as fh:
        fh.write("\n".join(parts))


def _write_reliability(
    out_dir: Path, predictions: list[dict[str, Any]], manifest: str, run: str = AUTO
) -> dict[str, Path]:
    """calibration.json and reliability.png for the auto run (``_lalm`` files for the judge's run): are its
    probabilities probabilities?"""
    from sleuthd_bench import plots, reliability

    probs, labels = reliability.turn_pairs(predictions, run)
    if len(probs) == 0:
        return {}
    summary = reliability.summary(probs, labels)
    suffix = "" if run == AUTO else f"_{run}"
    path = out_dir / f"calibration{suffix}.json"
    path.write_text(json.dumps({"manifest": manifest, "run": run, **summary}, indent=2) + "\n")
    png = plots.plot_reliability(summary, out_dir / f"reliability{suffix}.png", f"{run} on {manifest}")
    return {f"calibration{suffix}": path, f"reliability{suffix}": png}
