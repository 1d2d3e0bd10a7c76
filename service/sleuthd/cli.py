"""The `sleuthd` command line: serve, check, rank, models."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from google.protobuf.json_format import MessageToDict

if TYPE_CHECKING:
    from sleuthd.engine import EngineConfig

logger = logging.getLogger("sleuthd")


def default_models_dir() -> Path:
    """$SLEUTHD_MODELS_DIR, else the repository's models/ when running from a checkout, else ./models."""
    env = os.environ.get("SLEUTHD_MODELS_DIR")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[2] / "models"
    return checkout if checkout.is_dir() else Path("models")


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# ---------------------------------------------------------------------------------------------- serve


def engine_config(args: argparse.Namespace) -> EngineConfig:
    from sleuthd.batcher import BatcherConfig
    from sleuthd.engine import EngineConfig

    return EngineConfig(
        models_dir=args.models_dir,
        default_encoder=args.encoder,
        device=args.device,
        max_clip_seconds=args.max_clip_seconds,
        workers=args.workers,
        embedding_cache_entries=args.embedding_cache_entries,
        batching=args.batching,
        vad=args.vad,
        batcher=BatcherConfig(
            max_batch_windows=args.max_batch_windows,
            max_wait_ms=args.max_wait_ms,
            max_queue_windows=args.max_queue_windows,
            max_concurrent_batches=args.max_concurrent_batches,
        ),
    )


def cmd_serve(args: argparse.Namespace) -> int:
    from sleuthd.engine import Engine
    from sleuthd.metrics import ServiceMetrics
    from sleuthd.server import ServerConfig, serve_forever

    metrics = ServiceMetrics()
    engine = Engine.load(engine_config(args), observer=metrics)
    config = ServerConfig(
        host=args.host,
        port=args.port,
        max_message_bytes=args.max_message_mb * 1024 * 1024,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        metrics_host=args.metrics_host,
    )
    asyncio.run(serve_forever(engine, config, metrics))
    return 0


# ---------------------------------------------------------------------------------------------- check


async def _check(args: argparse.Namespace) -> int:
    from sleuthd import client

    req = client.dialogue_request_from_file(args.file)
    if args.method or args.thresholds or args.threshold is not None:
        o = req.options
        override = client.make_options(args.method, args.thresholds, args.threshold, o.encoder)
        if not args.method:
            override.method = o.method
        if not args.thresholds:
            override.threshold_set = o.threshold_set
        req.options.CopyFrom(override)
    async with client.channel(args.target) as ch:
        verdict = await client.call_with_retries(lambda: client.stub(ch).CheckDialogue(req, timeout=args.timeout))
    if args.json:
        print(json.dumps(MessageToDict(verdict, preserving_proto_field_name=True), indent=2))
    else:
        print(client.verdict_table(verdict))
    return 0 if all(s.consistent or not s.judged for s in verdict.speakers) else 3


async def _rank(args: argparse.Namespace) -> int:
    from sleuthd import client
    from sleuthd.v1 import sleuthd_pb2 as pb

    req = pb.RankCandidatesRequest(speaker=args.speaker, options=client.make_options(args.method))
    for p in args.context:
        req.context.append(client.audio_file(p))
    for p in args.candidate:
        req.candidates.add(candidate_id=p.name, audio=client.audio_file(p))
    if args.reference:
        req.reference.CopyFrom(client.audio_file(args.reference))
    async with client.channel(args.target) as ch:
        resp = await client.call_with_retries(lambda: client.stub(ch).RankCandidates(req, timeout=args.timeout))
    if args.json:
        print(json.dumps(MessageToDict(resp, preserving_proto_field_name=True), indent=2))
    else:
        print(client.ranking_table(resp))
    return 0


def _run_client(coro_fn, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from sleuthd.client import DialogueFileError
    from sleuthd.errors import InvalidRequest

    try:
        return int(asyncio.run(coro_fn(args)))
    except grpc.aio.AioRpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2
    except (DialogueFileError, InvalidRequest) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


# ---------------------------------------------------------------------------------------------- models


def cmd_models_export(args: argparse.Namespace) -> int:
    from sleuthd.export import models as model_export

    names = ["vad", "ge2e", "campplus"] if args.name == "all" else [args.name]
    for name in names:
        if name == "vad":
            path = model_export.export_vad_model(args.models_dir)
        elif name == "campplus":
            path = model_export.export_campplus_model(args.models_dir, args.parity_clips)
        elif name in ("ecapa", "wavlm-sv"):
            if args.checkpoint is None:
                raise SystemExit(f"`sleuthd models export {name}` needs --checkpoint DIR (the model folder)")
            export = model_export.export_ecapa_model if name == "ecapa" else model_export.export_wavlm_model
            path = export(args.models_dir, args.checkpoint, args.parity_clips)
        else:
            path = model_export.export_ge2e_model(args.models_dir, args.parity_clips)
        m = json.loads(path.read_text())
        parity = m.get("parity", {})
        extra = f", parity min cosine {parity['min_cosine']}" if parity.get("measured") else ""
        print(f"wrote {path} (sha256 {m['sha256'][:12]}…{extra})")
    return 0


# ---------------------------------------------------------------------------------------------- main


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine knobs shared by `serve` and the throughput benchmark (defaults from EngineConfig)."""
    from sleuthd.batcher import BatcherConfig
    from sleuthd.engine import EngineConfig

    e, b = EngineConfig(models_dir=Path(".")), BatcherConfig()
    p.add_argument("--workers", type=int, default=e.workers, help="decode/VAD/model threads; 0 = CPU count")
    p.add_argument(
        "--embedding-cache-entries",
        type=int,
        default=e.embedding_cache_entries,
        help=f"clip embeddings remembered by audio hash; 0 = off (default: {e.embedding_cache_entries})",
    )
    p.add_argument(
        "--vad", choices=["silero", "energy"], default=e.vad,
        help=f"speech detection: silero (robust to noise) or energy (fast, clean audio) (default: {e.vad})",
    )  # fmt: skip
    p.add_argument(
        "--batching", choices=["on", "off", "clip"], default="on",
        help="on: micro-batch windows across requests; off: one window per model call; clip: one call per clip",
    )  # fmt: skip
    p.add_argument(
        "--max-batch-windows",
        type=int,
        default=b.max_batch_windows,
        help=f"encoder windows per model call (default: {b.max_batch_windows})",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=b.max_wait_ms,
        help=f"longest wait of the oldest queued request before its batch runs, ms (default: {b.max_wait_ms})",
    )
    p.add_argument(
        "--max-queue-windows",
        type=int,
        default=b.max_queue_windows,
        help=f"queued windows before new requests get RESOURCE_EXHAUSTED (default: {b.max_queue_windows})",
    )
    p.add_argument(
        "--max-concurrent-batches", type=int, default=b.max_concurrent_batches,
        help=f"model calls in flight at once (default: {b.max_concurrent_batches})",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sleuthd", description="Speaker-consistency checks for synthesized dialogues.")
    p.add_argument("--log-level", default="info", help="debug, info, warning, error (default: info)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gRPC server")
    s.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    s.add_argument("--port", type=int, default=50051, help="port; 0 picks a free one and prints it (default: 50051)")
    s.add_argument("--models-dir", type=Path, default=default_models_dir(), help="folder of model manifests")
    s.add_argument("--encoder", default="ge2e", help="default encoder (default: ge2e)")
    s.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where encoders run")
    s.add_argument("--max-message-mb", type=int, default=64, help="largest request accepted, MiB (default: 64)")
    s.add_argument("--max-clip-seconds", type=float, default=300.0, help="longest clip accepted (default: 300)")
    add_engine_args(s)
    s.add_argument(
        "--metrics-port", type=int, default=9464, help="Prometheus /metrics port; 0 = any free port, -1 = off (9464)"
    )
    s.add_argument("--metrics-host", default="127.0.0.1", help="interface for /metrics (default: 127.0.0.1)")
    s.set_defaults(func=cmd_serve)

    def client_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--target", default="127.0.0.1:50051", help="server host:port (default: 127.0.0.1:50051)")
        sp.add_argument("--method", choices=["pairwise", "centroid", "reference"], help="default: the server's")
        sp.add_argument("--json", action="store_true", help="print the raw response as JSON")
        sp.add_argument("--timeout", type=float, default=120.0, help="RPC deadline, seconds (default: 120)")

    c = sub.add_parser("check", help="check a dialogue JSON file (exit 3 if a speaker is inconsistent)")
    c.add_argument("file", type=Path)
    client_args(c)
    c.add_argument("--thresholds", choices=["default", "paper"], help="threshold set (default: encoder's)")
    c.add_argument("--threshold", type=float, help="explicit threshold on the method's scale")
    c.set_defaults(func=lambda a: _run_client(_check, a))

    r = sub.add_parser("rank", help="rank candidate clips for one speaker's slot")
    r.add_argument("--speaker", default="speaker")
    r.add_argument("--context", type=Path, nargs="*", default=[], help="the speaker's other turns")
    r.add_argument("--candidate", type=Path, action="append", required=True, help="a candidate clip (repeat)")
    r.add_argument("--reference", type=Path, help="reference clip of the speaker")
    client_args(r)
    r.set_defaults(func=lambda a: _run_client(_rank, a))

    m = sub.add_parser("models", help="build model files")
    msub = m.add_subparsers(dest="models_command", required=True)
    e = msub.add_parser("export", help="export a model to ONNX and write its manifest")
    e.add_argument("name", choices=["ge2e", "campplus", "ecapa", "wavlm-sv", "vad", "all"])
    e.add_argument("--checkpoint", type=Path, help="ecapa / wavlm-sv: the checkpoint folder to export")
    e.add_argument("--models-dir", type=Path, default=default_models_dir())
    e.add_argument(
        "--parity-clips",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "tests" / "data" / "fsdd",
        help="folder of real-speech WAVs to measure parity with resemblyzer on",
    )
    e.set_defaults(func=cmd_models_export)

    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
