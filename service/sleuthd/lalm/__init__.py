"""The LALM judge (Qwen2-Audio / Qwen2.5-Omni, in-process or behind an OpenAI-compatible endpoint).

Importing this package imports neither torch nor transformers nor httpx; they load when a backend is built.
Start at :func:`sleuthd.lalm.judge.load_judge` and the :class:`sleuthd.lalm.judge.Judge` protocol.
"""
