"""Judgment: how embeddings become verdicts (see the layer plan in issue 26)."""
