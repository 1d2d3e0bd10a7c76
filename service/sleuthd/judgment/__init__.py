"""How turns are judged: the judgment layer (verdict rules, scoring, calibration, the evidence model)."""
