"""The UNCERTAIN outcome on the wire, in the client library and in the CLI's exit code and table.

The judgment that produces it is tested with the methods that do (auto, lalm); here: a turn the server
calls UNCERTAIN is neither flagged nor cleared anywhere a user reads it."""

from __future__ import annotations

from pathlib import Path

from sleuthd import domain
from sleuthd.cli import check as check_batch
from sleuthd.cli import text as tables
from sleuthd.client import Verdict
from sleuthd.judgment.verdicts import speaker_verdict
from sleuthd.rpc import convert

_FLAGGED = domain.TurnResult("t2", "Maya", domain.TurnStatus.INCONSISTENT, 3.0, 2.5, score=0.9)
_UNSURE = domain.TurnResult(
    "t3", "Maya", domain.TurnStatus.UNCERTAIN, 3.0, 2.4, score=0.2,
    detail="outside the calibration's range", uncertain_reason=domain.UncertainReason.OUT_OF_SUPPORT,
)  # fmt: skip
_CLEAR = domain.TurnResult("t1", "Maya", domain.TurnStatus.CONSISTENT, 3.0, 2.6, score=0.01)


def _result(*turns: domain.TurnResult) -> domain.DialogueResult:
    speaker = speaker_verdict("Maya", [(t.turn_id, t.status) for t in turns])
    return domain.DialogueResult("d", turns, (speaker,), "ge2e", domain.Method.AUTO, domain.ThresholdSet.DEFAULT)


def test_an_uncertain_turn_is_scored_but_the_speaker_is_not_called_consistent() -> None:
    s = _result(_CLEAR, _UNSURE).speakers[0]
    assert s.judged and not s.consistent and s.inconsistent_turn_ids == () and s.uncertain_turn_ids == ("t3",)
    assert (s.scored_turns, s.unscored_turns) == (2, 0)
    flagged = _result(_CLEAR, _FLAGGED, _UNSURE).speakers[0]
    assert flagged.inconsistent_turn_ids == ("t2",) and flagged.uncertain_turn_ids == ("t3",)


def test_the_client_library_reads_uncertain_turns_and_their_reason() -> None:
    verdict = Verdict.from_pb(convert.verdict_to_pb(_result(_CLEAR, _UNSURE)))
    assert verdict.uncertain_turns == ("t3",) and verdict.inconsistent_turns == ()
    assert not verdict.consistent and verdict.judged
    assert verdict.turn("t3").uncertain_reason == "out_of_support" and verdict.turn("t1").uncertain_reason == ""
    assert verdict.speaker("Maya").uncertain_turns == ("t3",)


def test_check_exits_5_on_uncertain_unless_something_is_inconsistent(tmp_path: Path) -> None:
    source = check_batch.DialogueSource("d.json", {}, tmp_path, "d")

    def outcome(*turns: domain.TurnResult) -> check_batch.Outcome:
        return check_batch.Outcome(source, "d", convert.verdict_to_pb(_result(*turns)))

    assert check_batch.exit_code([outcome(_CLEAR, _UNSURE)]) == check_batch.EXIT_UNCERTAIN == 5
    assert check_batch.exit_code([outcome(_CLEAR, _UNSURE), outcome(_CLEAR, _FLAGGED)]) == 3
    assert check_batch.exit_code([outcome(_CLEAR)]) == 0
    table = tables.verdict_table(convert.verdict_to_pb(_result(_CLEAR, _UNSURE)))
    assert "speaker Maya: UNCERTAIN (listen): t3" in table and "t3: outside the calibration's range" in table


def test_the_verdict_metric_says_why_a_turn_is_uncertain_or_flagged() -> None:
    """sleuthd_verdicts_total carries the reason (issue 32): the uncertain reasons as well as the flag reasons,
    each turn counted once however often a stream revises it."""
    from sleuthd.judgment.dialogue import VerdictLedger
    from sleuthd.ops.metrics import ServiceMetrics

    metrics = ServiceMetrics()
    ledger = VerdictLedger(metrics)
    confused = domain.TurnResult(
        "t4", "Maya", domain.TurnStatus.INCONSISTENT, 3.0, 2.5, score=0.8, reason=domain.FlagReason.SPEAKER_CONFUSION
    )
    ledger.count([_CLEAR, _UNSURE, confused])
    ledger.count([_CLEAR, _UNSURE])  # already counted
    count = metrics.registry.get_sample_value
    assert count("sleuthd_verdicts_total", {"status": "uncertain", "reason": "out_of_support"}) == 1
    assert count("sleuthd_verdicts_total", {"status": "inconsistent", "reason": "speaker_confusion"}) == 1
    assert count("sleuthd_verdicts_total", {"status": "consistent", "reason": "none"}) == 1
