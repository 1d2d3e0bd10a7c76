"""The voice registry's store: one behavioural suite run against SQLite and against a real PostgreSQL
server started for the session (tests/pgcluster.py), plus kill -9 durability and concurrent writers."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sleuthd.config import ConfigError, add_cli_args, from_cli_args
from sleuthd.errors import (
    Duplicate,
    InvalidRequest,
    LimitExceeded,
    OutOfSequence,
    RegistryFull,
    UnknownName,
    Unsupported,
)
from sleuthd.registry import AsyncVoiceStore, Embedding, RegistryConfig, RegistryUnavailable, open_store
from sleuthd.registry.sql import SqlStore
from sleuthd.registry.store import VoiceStore

from tests import pgcluster
from tests.registry_support import (
    WEIGHTS_A,
    WEIGHTS_B,
    clips_for,
    embedding_for,
    pcm_clip,
    recordings,
    vector_for,
)
from tests.support import REPO

_databases = itertools.count()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[pgcluster.PgCluster]:
    try:
        cluster = pgcluster.start()
    except pgcluster.PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL backend not tested: {exc}")
    yield cluster
    cluster.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty registry of each backend: a SQLite file, or a fresh database on the test server."""
    if request.param == "sqlite":
        return str(tmp_path / "voices.sqlite3")
    cluster: pgcluster.PgCluster = request.getfixturevalue("pg_cluster")
    return cluster.create_database(f"registry_{next(_databases)}")


def _open(location: str, **options: object) -> VoiceStore:
    store = open_store(RegistryConfig(registry=location, **options))  # type: ignore[arg-type]
    assert store is not None
    return store


@pytest.fixture
def store(location: str) -> Iterator[VoiceStore]:
    s = _open(location)
    yield s
    s.close()


# ------------------------------------------------------------------------------------------ basics


def test_register_then_get_returns_what_was_stored(store: VoiceStore) -> None:
    files = recordings()
    clips = [*clips_for(2), pcm_clip(files[5])]
    before = datetime.now(UTC)
    metadata = {"lang": "en", "tts": "vits/3"}
    voice = store.register("alice", clips, metadata=metadata, embeddings=[embedding_for("alice")])
    assert voice.revision == 1 and voice.audio_kept
    assert before - timedelta(seconds=1) <= voice.created_at == voice.updated_at <= datetime.now(UTC)

    got = store.get("alice", with_audio=True)
    assert got.metadata == {"lang": "en", "tts": "vits/3"}
    assert (got.created_at, got.updated_at, got.revision) == (voice.created_at, voice.updated_at, 1)
    assert [c.data for c in got.clips] == [c.data for c in clips]
    assert got.clips[2].pcm == clips[2].pcm and got.clips[0].pcm is None
    assert [c.audio_seconds for c in got.clips] == [c.audio_seconds for c in clips]
    assert got.speech_seconds == pytest.approx(sum(c.speech_seconds for c in clips))
    assert 0 < got.speech_seconds < sum(c.audio_seconds for c in clips)  # the VAD trimmed silence
    (emb,) = got.embeddings
    assert (emb.encoder, emb.weights_sha256, emb.dim, emb.dtype) == ("ge2e", WEIGHTS_A, 256, "float32")
    np.testing.assert_array_equal(emb.vector, vector_for("alice", WEIGHTS_A))

    light = store.get("alice")  # without audio: hashes and sizes only
    assert all(c.data is None for c in light.clips)
    assert [c.sha256 for c in light.clips] == [c.sha256 for c in got.clips]
    assert [c.n_bytes for c in light.clips] == [len(c.data) for c in clips]


def test_duplicate_id_is_refused_unless_replace(store: VoiceStore) -> None:
    first = store.register("bob", clips_for(2), embeddings=[embedding_for("bob")])
    with pytest.raises(Duplicate, match=r"'bob' is already registered.*replace"):
        store.register("bob", clips_for(1, start=9))
    assert len(store.get("bob").clips) == 2  # the refused registration changed nothing

    time.sleep(0.002)
    second = store.register("bob", clips_for(1, start=9), metadata={"v": "2"}, replace=True)
    assert second.revision == 2
    got = store.get("bob")
    assert got.created_at == first.created_at and got.updated_at > first.updated_at
    assert len(got.clips) == 1 and got.metadata == {"v": "2"}
    assert got.embeddings == ()  # embeddings of the old clips are gone with them
    assert store.count() == 1


def test_unknown_voice_is_not_found_everywhere(store: VoiceStore) -> None:
    store.register("known", clips_for(1))
    for call in (
        lambda: store.get("ghost"),
        lambda: store.delete("ghost"),
        lambda: store.embedding("ghost", "ge2e", WEIGHTS_A),
        lambda: store.require_embedding("ghost", "ge2e", WEIGHTS_A),
        lambda: store.put_embedding("ghost", embedding_for("ghost")),
    ):
        with pytest.raises(UnknownName, match="no voice 'ghost' is registered"):
            call()


def test_delete_removes_the_voice_and_frees_its_id(store: VoiceStore) -> None:
    store.register("carol", clips_for(2), embeddings=[embedding_for("carol")])
    store.register("dave", clips_for(1))
    store.delete("carol")
    with pytest.raises(UnknownName):
        store.get("carol")
    assert store.count() == 1
    assert store.register("carol", clips_for(1)).revision == 1  # a new voice, not a replacement
    assert store.get("carol").embeddings == ()


def test_list_pages_in_stable_bytewise_order(store: VoiceStore) -> None:
    ids = ["bob_1", "Zed", "alice", "bob-2", "bob.1", "9lives", "carol", "a:b@c"]
    for voice_id in random.Random(3).sample(ids, len(ids)):
        store.register(voice_id, clips_for(1))
    seen, token, pages = [], "", 0
    while True:
        page = store.list_voices(page_size=3, page_token=token)
        assert len(page.voices) <= 3 and all(c.data is None for v in page.voices for c in v.clips)
        seen += [v.voice_id for v in page.voices]
        pages += 1
        if pages == 1:
            store.register("zz-added-later", clips_for(1))  # after the cursor: must show up once
            store.register("AAA-added-later", clips_for(1))  # before it: must not
        token = page.next_page_token
        if not token:
            break
    assert seen == sorted([*ids, "zz-added-later"])  # sorted() on ASCII = bytewise, as both backends order
    assert pages == 3
    assert [v.voice_id for v in store.list_voices().voices] == sorted([*ids, "zz-added-later", "AAA-added-later"])

    with pytest.raises(InvalidRequest, match="page_token is not one this registry issued"):
        store.list_voices(page_token="bogus")
    with pytest.raises(InvalidRequest, match="page_size must be 0"):
        store.list_voices(page_size=5000)


# ------------------------------------------------------------------------------------------ bounds


def test_bounds_are_enforced_with_errors_that_name_the_limit(location: str) -> None:
    small = _open(
        location,
        registry_max_voices=2,
        registry_max_clips_per_voice=2,
        registry_max_clip_mb=0.02,
        registry_max_voice_mb=0.03,
        registry_max_clip_seconds=1.0,
        registry_max_metadata_entries=2,
        registry_max_metadata_bytes=20,
    )
    clip = clips_for(1)[0]
    assert len(clip.data) < 0.02 * 2**20 and clip.audio_seconds < 1.0
    cases: list[tuple[type[Exception], str, dict]] = [
        (LimitExceeded, "at most 2 .registry_max_clips_per_voice", {"clips": clips_for(3)}),
        (LimitExceeded, "per clip .registry_max_clip_mb", {"clips": [dataclasses.replace(clip, data=bytes(30_000))]}),
        (LimitExceeded, "registry_max_voice_mb", {"clips": [dataclasses.replace(c, data=bytes(18_000) + c.data)
                                                           for c in clips_for(2)]}),
        (LimitExceeded, "registered clips may be 1 s", {"clips": [dataclasses.replace(clip, audio_seconds=1.5)]}),
        (LimitExceeded, "registry_max_metadata_entries", {"metadata": {"a": "1", "b": "2", "c": "3"}}),
        (LimitExceeded, "registry_max_metadata_bytes", {"metadata": {"a": "x" * 30}}),
        (InvalidRequest, "metadata key 'bad key'", {"metadata": {"bad key": "1"}}),
        (InvalidRequest, "at least one clip", {"clips": []}),
        (InvalidRequest, "clip 1 has the same bytes as clip 0", {"clips": [clip, clip]}),
        (InvalidRequest, "speech_seconds must be between", {"clips": [dataclasses.replace(clip, speech_seconds=5.0)]}),
        (InvalidRequest, "weights_sha256 'abc' is not a SHA-256",
         {"embeddings": [Embedding("ge2e", "abc", np.ones(4))]}),
        (InvalidRequest, "NaN", {"embeddings": [Embedding("ge2e", WEIGHTS_A, np.array([1.0, np.nan]))]}),
        (InvalidRequest, "must be a vector", {"embeddings": [Embedding("ge2e", WEIGHTS_A, np.ones((2, 2)))]}),
        (InvalidRequest, "dtype int64", {"embeddings": [Embedding("ge2e", WEIGHTS_A, np.ones(3, np.int64))]}),
    ]  # fmt: skip
    for error, message, change in cases:
        kwargs = {"clips": [clip], **change}
        with pytest.raises(error, match=message):
            small.register("v1", kwargs.pop("clips"), **kwargs)
    for bad in ("", "-lead", "a b", "x" * 129, "é"):
        with pytest.raises(InvalidRequest, match="is not valid: use 1–128 characters"):
            small.register(bad, [clip])
    assert small.count() == 0  # nothing refused left a trace

    small.register("v1", [clip])
    small.register("v2", [clip])
    with pytest.raises(LimitExceeded, match=r"holds 2 voices, its limit \(registry_max_voices"):
        small.register("v3", [clip])
    small.register("v2", clips_for(2), replace=True)  # replacing does not add a voice
    small.close()


def test_the_audio_kept_in_all_is_bounded(location: str) -> None:
    # Issue 33, finding 6: 2,000 registrations of one 243 KB clip made a 473 MB SQLite file; nothing bounded it.
    clip = clips_for(1)
    small = _open(location, registry_max_total_mb=2.5 * len(clip[0].data) / 2**20)
    small.register("v1", clip)
    small.register("v2", clip)
    with pytest.raises(RegistryFull, match=r"over its limit of .* MiB \(registry_max_total_mb\): delete voices"):
        small.register("v3", clip)
    small.register("v3", clip, keep_audio=False)  # audio not kept: nothing counted
    small.register("v2", clip, replace=True)  # a replaced voice's old clips no longer count
    small.delete("v1")
    small.register("v4", clip)  # deleting frees its share
    assert small.count() == 3
    small.close()


def test_a_new_sqlite_registry_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    # Issue 33, finding 6: the file keeps voice audio and was created 0644 (readable by every local user).
    path = tmp_path / "voices.sqlite3"
    store = _open(str(path))
    store.register("v1", clips_for(1))
    for made in (path, path.with_name(path.name + "-wal")):
        assert oct(made.stat().st_mode & 0o777) == oct(0o600), made
    store.close()


def test_a_failure_inside_the_transaction_leaves_nothing(store: VoiceStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.register("keep", clips_for(2), embeddings=[embedding_for("keep")])

    def broken(*args: object) -> None:
        raise RuntimeError("disk gave up after the clips were written")

    monkeypatch.setattr(SqlStore, "_upsert_embedding", staticmethod(broken))
    with pytest.raises(RuntimeError):
        store.register("half", clips_for(3), embeddings=[embedding_for("half")])
    with pytest.raises(RuntimeError):
        store.register("keep", clips_for(1, start=7), embeddings=[embedding_for("keep", WEIGHTS_B)], replace=True)
    monkeypatch.undo()
    with pytest.raises(UnknownName):
        store.get("half")
    kept = store.get("keep")  # the failed replacement rolled back whole: old clips, old embedding, revision 1
    assert (kept.revision, len(kept.clips), [e.weights_sha256 for e in kept.embeddings]) == (1, 2, [WEIGHTS_A])


# ------------------------------------------------------------------------------------------ embeddings


def test_embeddings_are_kept_per_encoder_weights_and_never_swapped(store: VoiceStore) -> None:
    voice = store.register("erin", clips_for(3), embeddings=[embedding_for("erin", WEIGHTS_A)])
    store.register("frank", clips_for(2))
    assert store.embedding("erin", "ge2e", WEIGHTS_B) is None  # other weights: nothing, never A's vector
    found = store.embedding("erin", "ge2e", WEIGHTS_A)
    assert found is not None
    np.testing.assert_array_equal(found.vector, vector_for("erin", WEIGHTS_A))
    with pytest.raises(Unsupported, match=r"enrolled under other ge2e weights .*re-embed it from its stored clips"):
        store.require_embedding("erin", "ge2e", WEIGHTS_B)
    with pytest.raises(Unsupported, match="it has no ecapa embedding"):
        store.require_embedding("erin", "ecapa", WEIGHTS_A)

    assert store.lacking_embedding("ge2e", WEIGHTS_B) == ["erin", "frank"]
    assert store.lacking_embedding("ge2e", WEIGHTS_A) == ["frank"]
    assert store.lacking_embedding("ge2e", WEIGHTS_B, after="erin") == ["frank"]

    # re-embedding from the stored audio: read with audio, embed, write back guarded by the revision read
    again = store.get("erin", with_audio=True)
    assert all(c.data for c in again.clips)
    store.put_embedding("erin", embedding_for("erin", WEIGHTS_B), revision=again.revision)
    assert store.lacking_embedding("ge2e", WEIGHTS_B) == ["frank"]
    both = store.get("erin").embeddings
    assert sorted(e.weights_sha256 for e in both) == sorted([WEIGHTS_A, WEIGHTS_B])
    required = store.require_embedding("erin", "ge2e", WEIGHTS_B)
    np.testing.assert_array_equal(required.vector, vector_for("erin", WEIGHTS_B))

    store.register("erin", clips_for(1), replace=True)  # replaced while an old read was being embedded
    with pytest.raises(OutOfSequence, match=r"was replaced \(revision 2, read at 1"):
        store.put_embedding("erin", embedding_for("erin", WEIGHTS_A), revision=voice.revision)
    assert store.get("erin").embeddings == ()


def test_without_kept_audio_only_hashes_remain_and_reenrolment_is_asked_for(location: str) -> None:
    store = _open(location, registry_keep_audio="off")
    clips = clips_for(2)
    voice = store.register("gina", clips, embeddings=[embedding_for("gina")])
    got = store.get("gina", with_audio=True)
    assert not voice.audio_kept and not got.audio_kept
    assert all(c.data is None for c in got.clips) and [c.n_bytes for c in got.clips] == [len(c.data) for c in clips]
    with pytest.raises(Unsupported, match=r"clips were not kept .*register it again with its clips"):
        store.require_embedding("gina", "ge2e", WEIGHTS_B)
    store.register("hal", clips, keep_audio=True)  # the per-call choice wins over the config
    assert all(c.data for c in store.get("hal", with_audio=True).clips)
    store.close()


# ------------------------------------------------------------------------------------------ persistence


def test_everything_survives_close_and_reopen(location: str) -> None:
    first = _open(location)
    first.register("ivy", clips_for(3), metadata={"a": "b"}, embeddings=[embedding_for("ivy")])
    first.register("jon", clips_for(1))
    first.delete("jon")
    first.close()
    with pytest.raises(RegistryUnavailable, match="closed"):
        first.count()
    second = _open(location)
    got = second.get("ivy", with_audio=True)
    assert got.metadata == {"a": "b"} and [c.data for c in got.clips] == [c.data for c in clips_for(3)]
    np.testing.assert_array_equal(got.embeddings[0].vector, vector_for("ivy", WEIGHTS_A))
    assert second.count() == 1
    second.close()


# The columns each schema version added to registry_clips, and a clip's fields they hold.
_ADDED = {"2": ("bandwidth_hz",), "3": ("plateau", "snr_db"), "4": ("low_band_db",)}


@pytest.mark.parametrize("version", ["1", "2", "3"])
def test_an_older_registry_is_upgraded_in_place_and_keeps_its_voices(location: str, version: str) -> None:
    """A registry written before clips' channels were recorded (schema version 1: no bandwidth; 2: no plateau or
    SNR; 3: no low band level) is upgraded when a sleuthd opens it: its voices read as before, without those
    figures; new voices record them. One that is newer than this sleuthd is refused with what to do."""
    old = _open(location)
    assert isinstance(old, SqlStore)
    old.register("kim", clips_for(2), embeddings=[embedding_for("kim")])
    dropped = [c for v, cols in _ADDED.items() if v > version for c in cols]
    with old._transaction(write=True) as cur:  # back to that version's layout, as an older sleuthd left it
        for column in dropped:
            cur.execute(f"ALTER TABLE registry_clips DROP COLUMN {column}")
        cur.execute("UPDATE registry_meta SET value = ? WHERE key = 'schema_version'", (version,))
    old.close()

    store = _open(location)
    assert isinstance(store, SqlStore)
    kim = store.get("kim", with_audio=True)
    assert [c.data for c in kim.clips] == [c.data for c in clips_for(2)]
    for column in dropped:
        assert [getattr(c, column) for c in kim.clips] == [None, None], column
    np.testing.assert_array_equal(kim.embeddings[0].vector, vector_for("kim", WEIGHTS_A))
    # Measured later from its kept clips (sleuthd.registry.voices), they are recorded in place.
    with pytest.raises(OutOfSequence, match="was replaced"):
        store.put_channels("kim", [(4000.0, 0.0, 20.0, -10.0)] * 2, revision=kim.revision + 1)
    with pytest.raises(InvalidRequest, match="has 2 clips; 1 channels were sent"):
        store.put_channels("kim", [(4000.0, 0.0, 20.0, -10.0)], revision=kim.revision)
    with pytest.raises(InvalidRequest, match="clip 1: plateau must be a fraction"):
        store.put_channels("kim", [(4000.0, 0.0, 20.0, -10.0), (4000.0, -0.5, 20.0, -10.0)], revision=kim.revision)
    with pytest.raises(InvalidRequest, match="clip 0: low_band_db must be a finite number"):
        store.put_channels(
            "kim", [(4000.0, 0.0, 20.0, float("nan")), (4000.0, 0.0, 20.0, -10.0)], revision=kim.revision
        )
    with pytest.raises(UnknownName):
        store.put_channels("nobody", [], revision=1)
    store.put_channels("kim", [(4000.0, 0.0, 20.0, -10.0), (7000.0, 0.02, 9.5, -28.5)], revision=kim.revision)
    got = store.get("kim", with_audio=True)
    assert [(c.bandwidth_hz, c.plateau, c.snr_db, c.low_band_db) for c in got.clips] == [
        (4000.0, 0.0, 20.0, -10.0), (7000.0, 0.02, 9.5, -28.5)
    ]  # fmt: skip
    assert [c.data for c in got.clips] == [c.data for c in kim.clips] and got.revision == kim.revision
    measured = [
        dataclasses.replace(c, bandwidth_hz=3900.0 + k, plateau=0.01 * k, snr_db=12.5 + k, low_band_db=-12.0 - 16 * k)
        for k, c in enumerate(clips_for(2, start=5))
    ]
    for got in (store.register("lea", measured), store.get("lea")):
        assert [(c.bandwidth_hz, c.plateau, c.snr_db, c.low_band_db) for c in got.clips] == [
            (3900.0, 0.0, 12.5, -12.0), (3901.0, 0.01, 13.5, -28.0)
        ]  # fmt: skip
    clip = clips_for(1)[0]
    for field, value, message in (
        ("bandwidth_hz", float("nan"), "bandwidth_hz must be a positive number"),
        ("plateau", 1.5, "plateau must be a fraction from 0 to 1"),
        ("snr_db", float("inf"), "snr_db must be a finite number"),
        ("low_band_db", float("-inf"), "low_band_db must be a finite number"),
    ):
        with pytest.raises(InvalidRequest, match=message):
            store.register("max", [dataclasses.replace(clip, **{field: value})])
    with store._transaction(write=True) as cur:
        cur.execute("SELECT value FROM registry_meta WHERE key = 'schema_version'")
        assert cur.fetchone()[0] == "4"
        cur.execute("UPDATE registry_meta SET value = '5' WHERE key = 'schema_version'")
    store.close()
    with pytest.raises(RegistryUnavailable, match="schema is version 5; this sleuthd reads version 4: upgrade sleuthd"):
        _open(location)


def _verify_complete(store: VoiceStore, acknowledged: list[str]) -> None:
    """Every acknowledged voice is there, and every voice there is whole (3 clips + its embedding)."""
    present = []
    page = store.list_voices(page_size=1000)
    for listed in page.voices:
        voice = store.get(listed.voice_id, with_audio=True)
        n = int(voice.metadata["n"])
        assert [c.data for c in voice.clips] == [c.data for c in clips_for(3, start=n)], voice.voice_id
        np.testing.assert_array_equal(store.require_embedding(voice.voice_id, "ge2e", WEIGHTS_A).vector,
                                      vector_for(voice.voice_id, WEIGHTS_A))  # fmt: skip
        present.append(voice.voice_id)
    missing = set(acknowledged) - set(present)
    assert not missing, f"acknowledged but lost: {sorted(missing)}"


def test_kill_9_during_registration_loses_no_acknowledged_voice(location: str) -> None:
    acknowledged: list[str] = []
    rng = random.Random(7)
    for round_ in range(4):
        worker = subprocess.Popen(
            [sys.executable, "-m", "tests.registry_worker", "loop", location, f"r{round_}", "100000"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert worker.stdout is not None
        target = rng.randint(4, 12)
        for k in range(target):
            line = worker.stdout.readline()
            assert line, f"the worker exited early (code {worker.wait()})"
            acknowledged.append(line.strip())
            if k == 1:
                started = time.monotonic()
        per_voice = (time.monotonic() - started) / (target - 2)
        time.sleep(rng.uniform(0, per_voice))  # land the kill anywhere in the next registration
        os.kill(worker.pid, signal.SIGKILL)
        acknowledged += [line.strip() for line in worker.stdout]  # acknowledged before the kill landed
        assert worker.wait() == -signal.SIGKILL
        worker.stdout.close()

        store = _open(location)
        _verify_complete(store, acknowledged)
        store.close()
    if not location.startswith("postgresql://"):
        with sqlite3.connect(location) as raw:
            assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)


# ------------------------------------------------------------------------------------------ concurrency


def _workers(location: str, *argvs: list[str]) -> list[list[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.registry_worker", argv[0], location, *argv[1:]],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    outs = [p.communicate(timeout=120)[0].split("\n") for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs)
    return [[line for line in out if line] for out in outs]


def test_two_processes_register_at_once(location: str) -> None:
    # both open a registry that does not exist yet: creating the file, WAL and tables races too
    a, b = _workers(location, ["loop", "pa", "12"], ["loop", "pb", "12"])
    assert len(a) == len(b) == 12
    store = _open(location)
    _verify_complete(store, a + b)
    assert store.count() == 24

    contested = [f"same-{k}" for k in range(10)]
    first, second = _workers(location, ["race", *contested], ["race", *contested])
    for voice_id in contested:  # each id registered by exactly one process; the other was told Duplicate
        outcomes = sorted(line.split()[0] for line in first + second if line.split()[1] == voice_id)
        assert outcomes == ["dup", "ok"], voice_id
    assert store.count() == 34
    store.close()


async def test_async_wrapper_runs_concurrent_calls_off_the_event_loop(location: str) -> None:
    registry = AsyncVoiceStore(_open(location))
    ids = [f"async-{k}" for k in range(8)]
    voices = await asyncio.gather(
        *(registry.register(v, clips_for(2, start=k), embeddings=[embedding_for(v)]) for k, v in enumerate(ids))
    )
    assert sorted(v.voice_id for v in voices) == ids
    counts, page, found = await asyncio.gather(
        registry.count(), registry.list_voices(page_size=5), registry.require_embedding("async-3", "ge2e", WEIGHTS_A)
    )
    assert counts == 8 and [v.voice_id for v in page.voices] == ids[:5]
    np.testing.assert_array_equal(found.vector, vector_for("async-3", WEIGHTS_A))
    with pytest.raises(Duplicate):
        await registry.register("async-0", clips_for(1))
    await registry.delete("async-0")
    assert await registry.lacking_embedding("ge2e", WEIGHTS_A) == []
    await registry.close()


# ------------------------------------------------------------------------------------------ configuration


def test_open_store_chooses_the_backend_from_the_option(tmp_path: Path) -> None:
    assert open_store(RegistryConfig()) is None
    with pytest.raises(ConfigError, match="scheme 'mysql' is not supported"):
        open_store(RegistryConfig(registry="mysql://db/voices"))
    with pytest.raises(ConfigError, match="does not exist; create it first"):
        open_store(RegistryConfig(registry=str(tmp_path / "missing" / "voices.db")))
    (tmp_path / "notes.txt").write_text("not a database, just some text that is long enough to have a header\n" * 9)
    with pytest.raises(ConfigError, match=r"notes\.txt is not a SQLite database"):
        open_store(RegistryConfig(registry=str(tmp_path / "notes.txt")))
    store = open_store(RegistryConfig(registry=str(tmp_path)))  # a folder: the file goes inside
    assert store is not None and store.backend == "sqlite"
    store.register("x", clips_for(1))
    store.close()
    with sqlite3.connect(tmp_path / "registry.sqlite3") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert raw.execute("SELECT voice_id FROM registry_voices").fetchall() == [("x",)]


def test_registry_config_makes_flags_and_refuses_bad_values() -> None:
    parser = argparse.ArgumentParser()
    add_cli_args(parser, RegistryConfig, env={"SLEUTHD_REGISTRY_MAX_VOICES": "7"})
    args = parser.parse_args(["--registry", "postgresql://db/voices", "--registry-keep-audio", "off"])
    config = from_cli_args(RegistryConfig, args)
    assert (config.registry, config.keep_audio, config.registry_max_voices) == ("postgresql://db/voices", False, 7)
    assert config.max_clip_bytes == 16 * 2**20
    with pytest.raises(ConfigError, match="registry_max_clips_per_voice must be more than 0"):
        RegistryConfig(registry_max_clips_per_voice=0)
    with pytest.raises(ConfigError, match=r"registry_max_voice_mb .* must be at least registry_max_clip_mb"):
        RegistryConfig(registry_max_clip_mb=32, registry_max_voice_mb=16)
