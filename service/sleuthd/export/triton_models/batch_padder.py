"""Triton Python-backend model: every call of an encoder's ONNX model padded to one batch shape.

Copied as ``model.py`` in front of each encoder by ``sleuthd models triton-repo`` (without
``--python-backend``: the GPU repository). Why: ONNX Runtime's CUDA convolutions redo their algorithm
search whenever the input shape differs from the previous call's; on an H200 each change of batch size
cost CAM++ about 2 s, so the varying batches a dynamic batcher forms would serve a few windows per second
(docs/research/gpu/README.md). This model takes the batch Triton's dynamic batcher formed (at most
``rows`` windows, from any number of sleuthd replicas), pads it to exactly ``rows`` with repeats of its
last window, runs the ONNX model (``<name>_onnx``, fixed shape [rows, window_samples]) through a BLS call,
and hands each request its own rows; the padding rows are computed and dropped, as in
``sleuthd.encoder.OnnxEncoder`` on the CUDA provider.

Parameters (config.pbtxt): ``inner_model`` (the fixed-shape model) and ``rows``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

try:  # the same directory in the repository; the package's module in tests
    from onnx_runner import split_rows, stack_requests  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - depends on where it runs
    from sleuthd.export.triton_models.onnx_runner import split_rows, stack_requests


def pad_rows(batch: np.ndarray, rows: int) -> np.ndarray:
    """(n, width) -> (rows, width): the batch followed by repeats of its last row (n <= rows, n >= 1)."""
    n = len(batch)
    if not 1 <= n <= rows:
        raise ValueError(f"a batch of {n} windows cannot be padded to {rows}")
    if n == rows:
        return batch
    return np.concatenate([batch, np.repeat(batch[-1:], rows - n, axis=0)])


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]
        self.inner = params["inner_model"]
        self.rows = int(params["rows"])

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        arrays = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests]
        try:
            batch, counts = stack_requests(arrays)
            inner = pb_utils.InferenceRequest(
                model_name=self.inner,
                requested_output_names=[self.output_name],
                inputs=[pb_utils.Tensor(self.input_name, pad_rows(batch.astype(np.float32, copy=False), self.rows))],
            )
            response = inner.exec()
            if response.has_error():
                raise RuntimeError(response.error().message())
            out = pb_utils.get_output_tensor_by_name(response, self.output_name).as_numpy()
            parts = split_rows(out[: len(batch)], counts)
        except Exception as exc:  # every request of this batch gets the error, none a made-up answer
            error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}")
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor(self.output_name, p)]) for p in parts]
