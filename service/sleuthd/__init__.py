"""sleuthd: speaker-consistency checks for synthesized multi-turn dialogues, served over gRPC."""

__version__ = "0.1.0"
