"""The judge's server options: :class:`sleuthd.config.JudgeConfig`, re-exported here for the judge package.

They live with every other option in :mod:`sleuthd.config` (``EngineConfig.judge``), which makes the flags
(``--judge-model``, ``--judge-endpoint``, …) and ``SLEUTHD_JUDGE_*`` environment defaults.
"""

from __future__ import annotations

from sleuthd.config import JudgeConfig

__all__ = ["JudgeConfig"]
