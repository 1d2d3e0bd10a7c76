"""Speaker encoders: the clip embedder (cache, single flight), windows through the micro-batcher to the
ONNX runners, fusion, manifests, execution providers."""
