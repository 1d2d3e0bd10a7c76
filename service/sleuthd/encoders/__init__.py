"""Encoder runners (the planned home of the ONNX runner, batcher and fusion; today: the Triton client)."""
