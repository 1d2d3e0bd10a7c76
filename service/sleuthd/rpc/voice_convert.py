"""Small pure conversions between the voice registry's protobuf messages and its engine dataclasses."""

from __future__ import annotations

from sleuthd.registry.model import Voice
from sleuthd.registry.voices import Registration, VoiceListing, VoiceRegistry
from sleuthd.rpc.convert import audio_from_pb
from sleuthd.v1 import sleuthd_pb2 as pb


def registration_from_pb(msg: pb.RegisterVoiceRequest) -> Registration:
    return Registration(
        voice_id=msg.voice_id,
        clips=tuple(audio_from_pb(a, f"clips[{k}]") for k, a in enumerate(msg.clips)),
        metadata=dict(msg.metadata),
        replace=msg.replace,
        keep_audio=msg.keep_audio if msg.HasField("keep_audio") else None,
    )


def voice_to_pb(voice: Voice, registry: VoiceRegistry) -> pb.Voice:
    out = pb.Voice(
        voice_id=voice.voice_id,
        metadata=dict(voice.metadata),
        revision=voice.revision,
        speech_seconds=voice.speech_seconds,
        audio_kept=voice.audio_kept,
        clips=[
            pb.VoiceClip(
                sha256=c.sha256, size_bytes=c.n_bytes, audio_seconds=c.audio_seconds, speech_seconds=c.speech_seconds
            )
            for c in voice.clips
        ],
    )
    out.created_at.FromDatetime(voice.created_at)
    out.updated_at.FromDatetime(voice.updated_at)
    for e in voice.embeddings:
        msg = out.embeddings.add(
            encoder=e.encoder,
            weights_sha256=e.weights_sha256,
            dimension=e.dim,
            loaded=registry.loaded(e.encoder, e.weights_sha256),
        )
        if e.created_at is not None:
            msg.created_at.FromDatetime(e.created_at)
    return out


def listing_to_pb(listing: VoiceListing, registry: VoiceRegistry) -> pb.ListVoicesResponse:
    return pb.ListVoicesResponse(
        voices=[voice_to_pb(v, registry) for v in listing.page.voices],
        next_page_token=listing.page.next_page_token,
        total_size=listing.total,
    )


def registry_info_to_pb(registry: VoiceRegistry) -> pb.VoiceRegistryInfo:
    c = registry.config
    return pb.VoiceRegistryInfo(
        backend=registry.backend,
        keep_audio=c.keep_audio,
        max_voices=c.registry_max_voices,
        max_clips_per_voice=c.registry_max_clips_per_voice,
        max_clip_bytes=c.max_clip_bytes,
        max_voice_bytes=c.max_voice_bytes,
        max_clip_seconds=c.registry_max_clip_seconds,
        max_metadata_entries=c.registry_max_metadata_entries,
        max_metadata_bytes=c.registry_max_metadata_bytes,
    )
