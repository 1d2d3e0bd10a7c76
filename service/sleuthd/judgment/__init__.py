"""Judging dialogues: the Dialogue protocol and its encoder and LALM states, verdict rules, scoring,
calibration, drift, ranking, request options. Computation over embeddings and judge answers."""
