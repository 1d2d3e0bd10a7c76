"""The `sleuthd` command line: serve, check, rank, health, voices, models.

Server flags are generated from the config dataclasses (sleuthd.config), so each default is written once.
Research commands (benchmarks, replay, calibration fitting, synthesis) live in `sleuthd-bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from sleuthd import __version__
from sleuthd.cli.check import EXIT_ERROR, EXIT_OK
from sleuthd.config import (
    ConfigError,
    ConnectConfig,
    EngineConfig,
    ServerConfig,
    add_cli_args,
    default_models_dir,
    from_cli_args,
)
from sleuthd.export import parity_clips_dir

logger = logging.getLogger("sleuthd")


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


# ---------------------------------------------------------------------------------------------- serve


def cmd_serve(args: argparse.Namespace) -> int:
    from sleuthd.encoders import runtime
    from sleuthd.encoders.manifest import ManifestError
    from sleuthd.engine.facade import Engine
    from sleuthd.engine.memory import limit_malloc_arenas
    from sleuthd.errors import DependencyUnavailable, EngineFailure, InvalidRequest
    from sleuthd.ops import logs
    from sleuthd.ops.metrics import ServiceMetrics
    from sleuthd.rpc.server import check_ports, serve_forever

    metrics = ServiceMetrics()
    try:
        server_config = from_cli_args(ServerConfig, args)
        engine_config = from_cli_args(EngineConfig, args)
    except ConfigError as exc:
        return _error(str(exc))
    # One malloc arena per core, set before any thread starts (sleuthd.engine.memory).
    limit_malloc_arenas(os.cpu_count() or 2)
    # From here until the server has stopped, nothing the process writes can block it (sleuthd.ops.logs).
    logs.configure(args.log_level, server_config.log_format, capture=True)
    try:
        try:
            runtime.check_before_load(engine_config.device)
            check_ports(server_config)  # before the models load: a clash is reported in a moment, not seconds
            engine = Engine.load(engine_config, observer=metrics)
        # DependencyUnavailable: the voice registry's database cannot be reached at start-up
        except (ConfigError, ManifestError, EngineFailure, DependencyUnavailable, InvalidRequest, OSError) as exc:
            failure = str(exc)
        else:
            failure = ""
            try:
                runtime.check_after_load(engine_config.device, [(n, e.provider) for n, e in engine.encoders.items()])
                asyncio.run(serve_forever(engine, server_config, metrics))
            # a port taken, a TLS/token file unusable, CUDA fell back, the LALM judge cannot start
            except (ConfigError, OSError, EngineFailure) as exc:
                failure = str(exc)
    finally:
        logs.shutdown()
    return _error(failure) if failure else EXIT_OK


def cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the server says SERVING, 1 otherwise (Docker's HEALTHCHECK convention)."""
    import grpc

    from sleuthd.cli.health import health_status
    from sleuthd.client import CredentialsError

    try:
        status = asyncio.run(health_status(from_cli_args(ConnectConfig, args), args.timeout_seconds))
    except (ConfigError, CredentialsError) as exc:
        return _error(str(exc))
    except grpc.aio.AioRpcError as exc:
        print(f"unhealthy: {_rpc_error(exc, args)}", file=sys.stderr)
        return 1
    print(status)
    return EXIT_OK if status == "SERVING" else 1


# ---------------------------------------------------------------------------------------------- check, rank


def _json(message: Any) -> str:
    """Every field, false and zero included (only fields the server did not compute are left out)."""
    from google.protobuf.json_format import MessageToDict

    d = MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return json.dumps(d, indent=2)


def _voice_args(pairs: Sequence[str]) -> dict[str, str]:
    from sleuthd.client import DialogueFileError

    voices = {}
    for pair in pairs:
        speaker, sep, voice_id = pair.partition("=")
        if not sep or not speaker or not voice_id:
            raise DialogueFileError(f"--voice {pair!r}: expected SPEAKER=VOICE_ID")
        voices[speaker] = voice_id
    return voices


async def _check(args: argparse.Namespace) -> int:
    from sleuthd import client
    from sleuthd.cli import check, text
    from sleuthd.v1 import sleuthd_pb2 as pb

    sources = check.read_sources(args.files)
    flags = client.make_options(args.method, args.thresholds, args.threshold)
    voices = _voice_args(args.voice)
    if args.local and voices:
        raise client.DialogueFileError(
            "--voice names voices registered on a server, and --local judges without one: give the speaker's "
            "reference audio in the dialogue file instead, or drop --local"
        )

    def customize(req: pb.CheckDialogueRequest) -> None:
        """The command line's options and voices win over the dialogue file's."""
        if args.method:
            req.options.method = flags.method
        if args.thresholds:
            req.options.threshold_set = flags.threshold_set
        if args.threshold is not None:
            req.options.threshold = args.threshold
        if args.detect_drift:
            req.options.detect_drift = True
        if args.report:  # the report's heat map
            req.options.similarity_matrix = True
        if voices:
            kept = [r for r in req.references if r.speaker not in voices]
            del req.references[:]
            req.references.extend(kept)
            req.references.extend(pb.SpeakerReference(speaker=s, voice_id=v) for s, v in voices.items())

    single = len(sources) == 1
    progress = None if single or args.quiet else check.Progress(len(sources))
    if args.local:
        outcomes = await _check_locally(args, sources, customize, progress)
    else:
        tls = from_cli_args(ConnectConfig, args).use_tls
        async with client.Dialer.from_config(from_cli_args(ConnectConfig, args)).aio() as ch:
            outcomes = await check.check_all(
                sources, _server_check(client.stub(ch), args.timeout, tls), customize, args.concurrency, progress
            )
    if single:
        (outcome,) = outcomes
        if outcome.verdict is None:
            return _error(f"{outcome.code}: {outcome.error}")
        print(_json(outcome.verdict) if args.json else text.verdict_table(outcome.verdict))
    elif args.json:  # JSON Lines, one object per dialogue in input order
        for o in outcomes:
            body: dict[str, Any] = {"source": o.source.label, "dialogue_id": o.dialogue_id, "result": o.kind}
            if o.verdict is not None:
                body["verdict"] = json.loads(_json(o.verdict))
            else:
                body["error"] = {"code": o.code, "message": o.error}
            print(json.dumps(body))
    else:
        print(text.summary_table(check.summary_rows(outcomes)))
    for o in outcomes:
        if o.code and not single:
            print(f"error: {o.source.label}: dialogue {o.dialogue_id!r}: {o.code}: {o.error}", file=sys.stderr)
    if args.report:
        print(f"report: {check.report(outcomes, args.report, voices, args.report_audio)}", file=sys.stderr)
    return check.exit_code(outcomes)


def _server_check(stub: Any, timeout: float, tls: bool) -> Any:
    """One dialogue's check through a server's CheckDialogue (sleuthd.cli.check.CheckOne)."""
    import grpc

    from sleuthd.cli.check import RequestFailed
    from sleuthd.cli.text import explain_rpc_error

    async def check_one(req: Any) -> Any:
        try:
            return await stub.CheckDialogue(req, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            message = explain_rpc_error(code.name, exc.details() or "", tls)
            raise RequestFailed(code.name, message, server_gone=code is grpc.StatusCode.UNAVAILABLE) from None

    return check_one


async def _check_locally(args: argparse.Namespace, sources: Any, customize: Any, progress: Any) -> Any:
    """`sleuthd check --local`: every dialogue judged in this process (sleuthd.api.Judge), no server."""
    from sleuthd.api import Judge
    from sleuthd.cli import check
    from sleuthd.encoders.manifest import ManifestError
    from sleuthd.errors import EngineFailure
    from sleuthd.rpc.status import status_of

    # The server's engine options, SLEUTHD_* variables included, as `sleuthd serve` would read them.
    defaults = argparse.ArgumentParser()
    add_cli_args(defaults, EngineConfig)
    config = dataclasses.replace(from_cli_args(EngineConfig, defaults.parse_args([])), models_dir=args.models_dir)
    try:
        judge = Judge.from_config(config)
    except (ManifestError, EngineFailure, OSError) as exc:
        raise ConfigError(str(exc)) from None

    async def check_one(req: Any) -> Any:
        try:
            return await judge.check_request(req, args.timeout)
        except Exception as exc:
            known = status_of(exc)  # the code a server would answer with, so the rows and --json read the same
            if known is not None:
                raise check.RequestFailed(known[0].name, known[1]) from None
            if isinstance(exc, EngineFailure):
                raise check.RequestFailed("UNAVAILABLE", f"the scoring engine failed: {exc}", True) from None
            raise

    try:
        return await check.check_all(sources, check_one, customize, args.concurrency, progress)
    finally:
        await judge.aclose()


def candidate_ids(paths: Sequence[Path]) -> list[str]:
    """Each candidate's id: its file name, with as many parent folders as it takes to tell it apart from
    the other candidates (``c1/t05.wav``, ``c2/t05.wav``)."""
    from sleuthd.client import DialogueFileError

    parts = [p.resolve().parts for p in paths]
    seen: dict[tuple[str, ...], Path] = {}
    for p, full in zip(paths, parts, strict=True):
        if full in seen:
            raise DialogueFileError(f"candidate {p} is given twice (also as {seen[full]})")
        seen[full] = p
    depth = [1] * len(paths)
    while True:
        ids = ["/".join(full[-d:]) for full, d in zip(parts, depth, strict=True)]
        clashes = [i for i, x in enumerate(ids) if ids.count(x) > 1]
        if not clashes:
            return ids
        for i in clashes:
            depth[i] += 1


async def _rank(args: argparse.Namespace) -> int:
    from sleuthd import client
    from sleuthd.cli import text
    from sleuthd.v1 import sleuthd_pb2 as pb

    opts = client.make_options(args.method, detect_drift=False)
    req = pb.RankCandidatesRequest(speaker=args.speaker, options=opts)
    for p in args.context:
        req.context.append(client.audio_file(p))
    for cid, p in zip(candidate_ids(args.candidate), args.candidate, strict=True):
        req.candidates.add(candidate_id=cid, audio=client.audio_file(p))
    if args.reference and args.reference_voice:
        raise client.DialogueFileError("give either --reference or --reference-voice, not both")
    if args.reference:
        req.reference.CopyFrom(client.audio_file(args.reference))
    elif args.reference_voice:
        req.reference_voice_id = args.reference_voice
    async with client.Dialer.from_config(from_cli_args(ConnectConfig, args)).aio() as ch:
        resp = await client.stub(ch).RankCandidates(req, timeout=args.timeout)
    print(_json(resp) if args.json else text.ranking_table(resp))
    if args.report:
        from sleuthd.report import RankedCandidates, write_ranking_report

        audio = dict(zip(candidate_ids(args.candidate), args.candidate, strict=True))
        ranked = RankedCandidates(client.Ranking.from_pb(resp), audio, args.context, args.reference,
                                  args.reference_voice or "", args.speaker)  # fmt: skip
        print(f"report: {write_ranking_report(args.report, ranked, audio=args.report_audio)}", file=sys.stderr)
    return EXIT_OK


def _rpc_error(exc: Any, args: argparse.Namespace) -> str:
    """``CODE: details`` of a failed RPC (grpc.aio.AioRpcError), with what to try (sleuthd.cli.text)."""
    from sleuthd.cli.text import explain_rpc_error

    try:
        tls = from_cli_args(ConnectConfig, args).use_tls
    except ConfigError:
        tls = False
    return f"{exc.code().name}: {explain_rpc_error(exc.code().name, exc.details() or '', tls)}"


def _run_client(coro_fn: Callable[[argparse.Namespace], Coroutine[Any, Any, int]], args: argparse.Namespace) -> int:
    import grpc

    from sleuthd.client import CredentialsError, DialogueFileError
    from sleuthd.report import ReportError

    try:
        return int(asyncio.run(coro_fn(args)))
    except grpc.aio.AioRpcError as exc:
        return _error(_rpc_error(exc, args))
    except (DialogueFileError, CredentialsError, ConfigError, ReportError) as exc:
        return _error(str(exc))


# ---------------------------------------------------------------------------------------------- voices


def _metadata_args(pairs: Sequence[str]) -> dict[str, str]:
    from sleuthd.client import DialogueFileError

    metadata = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise DialogueFileError(f"--metadata {pair!r}: expected KEY=VALUE")
        metadata[key] = value
    return metadata


async def _voices(args: argparse.Namespace) -> int:
    """`sleuthd voices register|list|show|delete` against a server's voice registry."""
    from sleuthd import client
    from sleuthd.cli import text
    from sleuthd.v1 import sleuthd_pb2 as pb

    call = {"timeout": args.timeout}
    async with client.Dialer.from_config(from_cli_args(ConnectConfig, args)).aio() as ch:
        stub = client.stub(ch)
        if args.voices_command == "register":
            keep = None if args.keep_audio is None else args.keep_audio == "on"
            for path in args.clips:
                client.audio_file(path, read=False)  # a missing clip, named before anything is sent
            req = client.register_request(
                args.voice_id, [client.audio_file(p) for p in args.clips], metadata=_metadata_args(args.metadata),
                replace=args.replace, keep_audio=keep,
            )  # fmt: skip
            voice = await stub.RegisterVoice(req, **call)
            info = client.VoiceInfo.from_pb(voice)
            print(_json(voice) if args.json else text.voice_text(info))
        elif args.voices_command == "list":
            listed: list[Any] = []
            token = ""
            while True:
                page = await stub.ListVoices(pb.ListVoicesRequest(page_token=token), **call)
                listed.extend(page.voices)
                token = page.next_page_token
                if not token:
                    break
            if args.json:
                for v in listed:  # JSON Lines, one voice per line, voice id order
                    print(json.dumps(json.loads(_json(v))))
            else:
                print(text.voices_table([client.VoiceInfo.from_pb(v) for v in listed]))
                print(f"\n{len(listed)} voice(s)")
        elif args.voices_command == "show":
            voice = await stub.GetVoice(pb.GetVoiceRequest(voice_id=args.voice_id), **call)
            print(_json(voice) if args.json else text.voice_text(client.VoiceInfo.from_pb(voice)))
        else:
            await stub.DeleteVoice(pb.DeleteVoiceRequest(voice_id=args.voice_id), **call)
            print(f"deleted voice {args.voice_id}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- models


def cmd_models_export(args: argparse.Namespace) -> int:
    from sleuthd.encoders.manifest import ManifestError

    names = ["vad", "ge2e", "campplus"] if args.name == "all" else [args.name]
    try:
        from sleuthd.export import models as model_export

        for name in names:
            if name == "vad":
                path = model_export.export_vad_model(args.models_dir)
            elif name == "campplus":
                path = model_export.export_campplus_model(args.models_dir, args.parity_clips)
            elif name in ("ecapa", "wavlm-sv"):
                if args.checkpoint is None:
                    return _error(f"`sleuthd models export {name}` needs --checkpoint DIR (the model folder)")
                export = model_export.export_ecapa_model if name == "ecapa" else model_export.export_wavlm_model
                path = export(args.models_dir, args.checkpoint, args.parity_clips)
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


def cmd_models_tiny_judge(args: argparse.Namespace) -> int:
    """A tiny randomly initialised judge checkpoint (for tests and trying `serve --judge-model`)."""
    from sleuthd.lalm.tiny import build_tiny_judge

    try:
        out = build_tiny_judge(args.dir, args.arch, args.seed)  # ConfigError without the judge extra
    except (ConfigError, OSError) as exc:
        return _error(str(exc))
    print(f"wrote {out} (a random {args.arch} judge: its answers mean nothing; see docs/judge.md)")
    return EXIT_OK


def cmd_models_judge_hash(args: argparse.Namespace) -> int:
    """The weights hash judge calibrations are keyed by (--judge-weights-sha256 for a remote judge)."""
    from sleuthd.lalm.calibration import weights_sha256

    try:
        print(weights_sha256(args.dir))
    except (ConfigError, OSError) as exc:
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
    h.add_argument("--timeout-seconds", type=float, default=5.0, help="how long to wait for the answer (default: 5)")
    h.set_defaults(func=cmd_health)

    def client_args(sp: argparse.ArgumentParser) -> None:
        add_cli_args(sp, ConnectConfig)  # target, TLS and token: the same flags as `sleuthd health`
        methods = ["pairwise", "centroid", "reference", "auto", "lalm"]
        sp.add_argument("--method", choices=methods, help="default: the server's (lalm: a server with a judge)")
        sp.add_argument("--json", action="store_true", help="print the response as JSON, every field")
        sp.add_argument("--timeout", type=float, default=120.0, help="RPC deadline, seconds (default: 120)")
        sp.add_argument("--report", type=Path, metavar="DIR", help="also write an HTML review report: DIR/index.html")
        sp.add_argument("--report-audio", choices=["copy", "link"], default="copy", help="copy or link audio")

    c = sub.add_parser(
        "check",
        help="check dialogue JSON files or JSON Lines of dialogues (exit 3 if a speaker is inconsistent)",
        epilog="exit status: 0 every dialogue judged and consistent; 3 a speaker of some dialogue is inconsistent; "
        "5 nothing inconsistent but some turn is uncertain (neither flagged nor cleared: listen to it); "
        "4 nothing inconsistent or uncertain but some dialogue had no speaker that could be judged (too little "
        "speech); 2 bad input or a failed request",
    )
    c.add_argument(
        "files", type=Path, nargs="+", metavar="FILE",
        help="a dialogue JSON file, a .jsonl file of dialogue objects (audio paths relative to the file), or a "
        "folder: every *.json and *.jsonl under it, subfolders included, in sorted order",
    )  # fmt: skip
    client_args(c)
    c.add_argument(
        "--local", action="store_true",
        help="judge in this process (sleuthd.api.Judge: the server's engine and defaults), without a server; "
        "the connection flags are then unused",
    )  # fmt: skip
    c.add_argument(
        "--models-dir", type=Path, default=default_models_dir(),
        help="with --local: folder of model manifests (default: $SLEUTHD_MODELS_DIR, else the checkout's models/)",
    )  # fmt: skip
    c.add_argument("--thresholds", choices=["default", "paper"], help="threshold set (default: encoder's)")
    c.add_argument("--threshold", type=float, help="explicit threshold on the method's scale")
    c.add_argument("--detect-drift", action="store_true", help="also look for voice changes inside each turn")
    c.add_argument(
        "--voice", action="append", default=[], metavar="SPEAKER=VOICE_ID",
        help="judge SPEAKER against a voice registered on the server (repeat; overrides the file's reference)",
    )  # fmt: skip
    c.add_argument("--concurrency", type=int, default=4, help="dialogues checked at once (default: 4)")
    c.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    c.set_defaults(func=lambda a: _run_client(_check, a))

    v = sub.add_parser("voices", help="register, list, show and delete voices in a server's voice registry")
    vsub = v.add_subparsers(dest="voices_command", required=True)

    def voice_args(sp: argparse.ArgumentParser) -> None:
        add_cli_args(sp, ConnectConfig)
        sp.add_argument("--timeout", type=float, default=120.0, help="RPC deadline, seconds (default: 120)")
        sp.add_argument("--json", action="store_true", help="print the server's answer as JSON, every field")
        sp.set_defaults(func=lambda a: _run_client(_voices, a))

    vr = vsub.add_parser("register", help="enrol a voice from one or more reference clips")
    vr.add_argument("voice_id", help="the id to name the voice by (check --voice SPEAKER=VOICE_ID)")
    vr.add_argument("clips", type=Path, nargs="+", metavar="CLIP", help="reference audio files of the voice")
    vr.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE", help="a label to keep (repeat)")
    vr.add_argument("--replace", action="store_true", help="replace a voice registered under this id")
    vr.add_argument("--keep-audio", choices=["on", "off"], help="keep the clips' bytes (default: the server's)")
    voice_args(vr)
    vl = vsub.add_parser("list", help="every registered voice, in voice id order")
    voice_args(vl)
    vs = vsub.add_parser("show", help="one voice: its clips, embeddings and metadata")
    vs.add_argument("voice_id")
    voice_args(vs)
    vd = vsub.add_parser("delete", help="delete a voice")
    vd.add_argument("voice_id")
    voice_args(vd)

    r = sub.add_parser("rank", help="rank candidate clips for one speaker's slot")
    r.add_argument("--speaker", default="speaker")
    r.add_argument("--context", type=Path, nargs="*", default=[], help="the speaker's other turns")
    r.add_argument("--candidate", type=Path, action="append", required=True, help="a candidate clip (repeat)")
    r.add_argument("--reference", type=Path, help="reference clip of the speaker")
    r.add_argument("--reference-voice", metavar="VOICE_ID", help="a voice registered on the server as the reference")
    client_args(r)
    r.set_defaults(func=lambda a: _run_client(_rank, a))

    m = sub.add_parser("models", help="build model files")
    msub = m.add_subparsers(dest="models_command", required=True)
    e = msub.add_parser("export", help="export a model to ONNX and write its manifest")
    e.add_argument("name", choices=["ge2e", "campplus", "ecapa", "wavlm-sv", "vad", "all"])
    e.add_argument("--checkpoint", type=Path, help="ecapa / wavlm-sv: the checkpoint folder to export")
    e.add_argument("--models-dir", type=Path, default=default_models_dir(), help="folder of model manifests")
    e.add_argument(
        "--parity-clips",
        type=Path,
        default=parity_clips_dir(),
        help="folder of real-speech WAVs to measure parity with the reference models on (default: the FSDD "
        "takes shipped in sleuthd/export/parity_clips)",
    )
    e.set_defaults(func=cmd_models_export)
    from sleuthd.export.triton_repo import add_parser as add_triton_repo_parser

    add_triton_repo_parser(msub, default_models_dir())
    t = msub.add_parser("tiny-judge", help="write a tiny random LALM judge folder (serve --judge-model DIR)")
    t.add_argument("dir", type=Path)
    t.add_argument("--arch", choices=["qwen2-audio", "qwen2.5-omni"], default="qwen2-audio")
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=cmd_models_tiny_judge)
    h = msub.add_parser("judge-hash", help="print the SHA-256 of a judge model folder's weights")
    h.add_argument("dir", type=Path)
    h.set_defaults(func=cmd_models_judge_hash)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from sleuthd.ops import logs

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
