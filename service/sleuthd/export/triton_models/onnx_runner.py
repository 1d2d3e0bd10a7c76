"""Triton Python-backend model: one sleuthd encoder's ONNX file run with ONNX Runtime on the CPU.

Copied as ``model.py`` by ``sleuthd models triton-repo --python-backend``. It stands in for Triton's
``onnxruntime`` backend where that backend is missing (the ``nvidia-pytriton`` wheel's server has only the
Python backend): the same ONNX file, the same session options as ``sleuthd.encoder.OnnxEncoder``, behind
Triton's own dynamic batcher. Self-contained on purpose: Triton runs it in its own Python environment,
where sleuthd is not installed.

Parameters (config.pbtxt): ``onnx_file`` (default model.onnx, in the version folder) and
``intra_op_threads`` (0 = the CPU count).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np


def stack_requests(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """The windows of the requests Triton batched, as one (rows, window_samples) array, and each one's rows."""
    counts = [len(a) for a in arrays]
    return (arrays[0] if len(arrays) == 1 else np.concatenate(arrays)), counts


def split_rows(out: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    """Rows of one model call handed back to the requests they came from, in order."""
    if len(out) < sum(counts):
        raise ValueError(f"the model returned {len(out)} rows for {sum(counts)} windows")
    bounds = np.cumsum([0, *counts])
    return [np.ascontiguousarray(out[a:b]) for a, b in itertools.pairwise(bounds)]


def _parameters(config: dict[str, Any]) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        import onnxruntime as ort

        config = json.loads(args["model_config"])
        params = _parameters(config)
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]
        path = os.path.join(args["model_repository"], args["model_version"], params.get("onnx_file", "model.onnx"))
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(params.get("intra_op_threads", "0") or 0) or (os.cpu_count() or 1)
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        arrays = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests]
        try:
            batch, counts = stack_requests(arrays)
            (out,) = self.session.run([self.output_name], {self.input_name: batch.astype(np.float32, copy=False)})
            parts = split_rows(out, counts)
        except Exception as exc:  # onnxruntime raises its own types: every request of this batch gets the error
            error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}")
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor(self.output_name, p)]) for p in parts]
