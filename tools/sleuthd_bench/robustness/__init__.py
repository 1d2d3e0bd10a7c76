"""The robustness matrix (`sleuthd-bench robustness`): speech generated under conditions where fixed
thresholds and the shipped `auto` are known to struggle (other languages, expressive prosody, short
turns, codecs and rooms, channel drift, real and neural speech), the benchmark manifests built from it,
an offline evaluation of every judgment through the product's public API, and the fitting of the
evidence model (sleuthd.judgment.evidence). docs/research/robustness.md has the commands and results."""
