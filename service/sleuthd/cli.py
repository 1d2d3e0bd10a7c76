"""The `sleuthd` command line: serve, check, rank, models.

Server flags are generated from the config dataclasses (sleuthd.config), so each default is written once.
Research commands (benchmarks, replay, calibration fitting, synthesis) live in `sleuthd-bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from sleuthd import __version__
from sleuthd.config import (
    ConfigError,
    ConnectConfig,
    EngineConfig,
    ServerConfig,
    add_cli_args,
    default_models_dir,
    from_cli_args,
)

logger = logging.getLogger("sleuthd")

EXIT_OK, EXIT_ERROR, EXIT_INCONSISTENT = 0, 2, 3


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


# ---------------------------------------------------------------------------------------------- serve


def cmd_serve(args: argparse.Namespace) -> int:
    from sleuthd import logs, runtime
    from sleuthd.engine import Engine
    from sleuthd.errors import EngineFailure, InvalidRequest
    from sleuthd.manifest import ManifestError
    from sleuthd.metrics import ServiceMetrics
    from sleuthd.server import check_ports, serve_forever

    metrics = ServiceMetrics()
    try:
        server_config = from_cli_args(ServerConfig, args)
        engine_config = from_cli_args(EngineConfig, args)
        logs.configure(args.log_level, server_config.log_format)
        runtime.check_before_load(engine_config.device)
        check_ports(server_config)  # before the models load: a clash is reported in a moment, not seconds
        engine = Engine.load(engine_config, observer=metrics)
    except (ConfigError, ManifestError, EngineFailure, InvalidRequest, OSError) as exc:
        return _error(str(exc))
    try:
        runtime.check_after_load(engine_config.device, [(n, e.provider) for n, e in engine.encoders.items()])
        asyncio.run(serve_forever(engine, server_config, metrics))
    except (ConfigError, OSError) as exc:  # a port is taken, a TLS/token file is unusable, CUDA fell back
        return _error(str(exc))
    return EXIT_OK


def cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the server says SERVING, 1 otherwise (Docker's HEALTHCHECK convention)."""
    import grpc

    from sleuthd.credentials import CredentialsError
    from sleuthd.probe import health_status

    try:
        status = asyncio.run(health_status(from_cli_args(ConnectConfig, args)))
    except (ConfigError, CredentialsError) as exc:
        return _error(str(exc))
    except grpc.aio.AioRpcError as exc:
        print(f"unhealthy: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    print(status)
    return EXIT_OK if status == "SERVING" else 1


# ---------------------------------------------------------------------------------------------- check, rank


async def _check(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from sleuthd import client, tables

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
        verdict = await client.stub(ch).CheckDialogue(req, timeout=args.timeout)
    if args.json:
        print(json.dumps(MessageToDict(verdict, preserving_proto_field_name=True), indent=2))
    else:
        print(tables.verdict_table(verdict))
    return EXIT_OK if all(s.consistent or not s.judged for s in verdict.speakers) else EXIT_INCONSISTENT


async def _rank(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from sleuthd import client, tables
    from sleuthd.v1 import sleuthd_pb2 as pb

    req = pb.RankCandidatesRequest(speaker=args.speaker, options=client.make_options(args.method))
    for p in args.context:
        req.context.append(client.audio_file(p))
    for p in args.candidate:
        req.candidates.add(candidate_id=p.name, audio=client.audio_file(p))
    if args.reference:
        req.reference.CopyFrom(client.audio_file(args.reference))
    async with client.channel(args.target) as ch:
        resp = await client.stub(ch).RankCandidates(req, timeout=args.timeout)
    if args.json:
        print(json.dumps(MessageToDict(resp, preserving_proto_field_name=True), indent=2))
    else:
        print(tables.ranking_table(resp))
    return EXIT_OK


def _run_client(coro_fn: Callable[[argparse.Namespace], Coroutine[Any, Any, int]], args: argparse.Namespace) -> int:
    import grpc

    from sleuthd.client import DialogueFileError

    try:
        return int(asyncio.run(coro_fn(args)))
    except grpc.aio.AioRpcError as exc:
        return _error(f"{exc.code().name}: {exc.details()}")
    except DialogueFileError as exc:
        return _error(str(exc))


# ---------------------------------------------------------------------------------------------- models


def cmd_models_export(args: argparse.Namespace) -> int:
    from sleuthd.manifest import ManifestError

    names = ["vad", "ge2e"] if args.name == "all" else [args.name]
    try:
        from sleuthd.export import models as model_export

        for name in names:
            if name == "vad":
                path = model_export.export_vad_model(args.models_dir)
            else:
                path = model_export.export_ge2e_model(args.models_dir, args.parity_clips)
            m = json.loads(path.read_text())
            parity = m.get("parity", {})
            extra = f", parity min cosine {parity['min_cosine']}" if parity.get("measured") else ""
            print(f"wrote {path} (sha256 {m['sha256'][:12]}…{extra})")
    except ModuleNotFoundError as exc:  # torch, onnx, resemblyzer, onnxruntime: imported only here
        missing = exc.name or str(exc)
        extra = "cpu" if missing.split(".")[0] == "onnxruntime" else "export"
        hint = "pip install 'sleuthd[cpu,export]'" if extra == "export" else "pip install 'sleuthd[cpu]' (or [gpu])"
        return _error(f"exporting needs {missing!r}, which is not installed: it comes with the {extra} extra: {hint}")
    except (RuntimeError, ManifestError, OSError, ValueError) as exc:
        return _error(str(exc))
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sleuthd", description="Speaker-consistency checks for synthesized dialogues.")
    p.add_argument("--version", action="version", version=f"sleuthd {__version__}")
    p.add_argument("--log-level", default="info", help="debug, info, warning, error (default: info)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gRPC server")
    add_cli_args(s, ServerConfig)
    add_cli_args(s, EngineConfig)
    s.set_defaults(func=cmd_serve)

    h = sub.add_parser("health", help="ask a server's gRPC health service (exit 0 if SERVING, 1 if not)")
    add_cli_args(h, ConnectConfig)
    h.set_defaults(func=cmd_health)

    def client_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--target", default="127.0.0.1:50051", help="server host:port (default: 127.0.0.1:50051)")
        sp.add_argument("--method", choices=["pairwise", "centroid", "reference", "auto"], help="default: the server's")
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
    e.add_argument("name", choices=["ge2e", "vad", "all"])
    e.add_argument("--models-dir", type=Path, default=default_models_dir(), help="folder of model manifests")
    e.add_argument(
        "--parity-clips",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "tests" / "data" / "fsdd",
        help="folder of real-speech WAVs to measure parity with resemblyzer on",
    )
    e.set_defaults(func=cmd_models_export)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from sleuthd import logs

    try:
        args = build_parser().parse_args(argv)
        if args.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            return _error(f"--log-level {args.log_level!r} is not one of: debug, info, warning, error")
        logs.configure(args.log_level)
        code = int(args.func(args))
        sys.stdout.flush()  # here, not at interpreter exit, so a closed pipe is handled below
        return code
    except ConfigError as exc:  # a malformed SLEUTHD_* environment variable
        return _error(str(exc))
    except BrokenPipeError:
        # The reader went away (`sleuthd check --json | head`): not an error of ours. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again, and exit quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
