"""One CheckDialogue against a deployed sleuthd: the last step of docs/deploy.md, "Scaling out".

    python check.py dns:///sleuthd.sleuthd.svc.cluster.local:50051 dialogue.json \\
        --ca /etc/sleuthd/tls/ca.crt --server-name sleuthd.sleuthd.svc --token-file /etc/sleuthd/auth/tokens

The dialogue file is the client library's format (`sleuthd check` reads the same; `make demo` writes one in
data/demo). The channel is the client library's: round_robin over every replica the DNS name answers, UNAVAILABLE
retried on another. Prints the encoder and each speaker's flagged turns; exits 0 when the server answered, 1 when
the call failed (with the status code and the server's message).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import grpc
from sleuthd.client import Dialer, read_token, tls_credentials
from sleuthd.client.requests import dialogue_request_from_file
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc


async def check(args: argparse.Namespace) -> int:
    request = dialogue_request_from_file(args.dialogue)
    token = read_token(args.token_file) if args.token_file else None
    creds = tls_credentials(args.ca) if args.ca or args.server_name else None
    async with Dialer(args.target, creds, token, args.server_name).aio() as channel:
        try:
            verdict = await pb_grpc.SleuthStub(channel).CheckDialogue(request, timeout=args.timeout)
        except grpc.aio.AioRpcError as exc:
            print(f"CheckDialogue failed: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    print(f"dialogue {verdict.dialogue_id}: encoder {verdict.encoder}, {len(verdict.turns)} turns judged")
    for speaker in verdict.speakers:
        print(f"  {speaker.speaker}: flagged {list(speaker.inconsistent_turn_ids) or 'nothing'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("target", help="e.g. dns:///sleuthd.sleuthd.svc.cluster.local:50051")
    p.add_argument("dialogue", type=Path, help="a dialogue JSON file (audio paths relative to it)")
    p.add_argument("--ca", help="PEM CA that signed the server's certificate (TLS); omit for plaintext")
    p.add_argument("--server-name", help="the name in the server's certificate, when the target is another")
    p.add_argument("--token-file", help="bearer token file (its first token line is sent)")
    p.add_argument("--timeout", type=float, default=120.0, help="deadline, seconds (default: 120)")
    return asyncio.run(check(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
