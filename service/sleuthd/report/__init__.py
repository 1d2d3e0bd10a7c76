"""HTML review reports of checked dialogues and rankings: look at the verdicts and listen to the audio.

    from sleuthd.client import SleuthClient
    from sleuthd.report import CheckedDialogue, write_report

    turns = [("Maya", "m1.wav"), ("Tom", "t1.wav"), ("Maya", "m2.wav")]
    verdict = SleuthClient().check(turns, similarity_matrix=True)
    write_report("review", [CheckedDialogue.from_turns(verdict, turns)])   # review/index.html

The page is self-contained and offline: inline style, script
and data, the audio copied into ``review/audio/``. ``sleuthd check ... --report DIR`` and ``sleuthd rank
... --report DIR`` write the same pages. A client-side layer: it imports the standard library and the
client's result types only (NumPy only when samples are given as arrays, which the caller has loaded).
"""

from sleuthd.report.audio import AUDIO_MODES, ReportError
from sleuthd.report.model import CheckedDialogue, RankedCandidates
from sleuthd.report.page import render_page, write_ranking_report, write_report

__all__ = [
    "AUDIO_MODES",
    "CheckedDialogue",
    "RankedCandidates",
    "ReportError",
    "render_page",
    "write_ranking_report",
    "write_report",
]
