"""Build the GE2E speaker encoder as one ONNX graph from the weights bundled in ``resemblyzer``.

Needs the ``export`` extra (torch to read the checkpoint, librosa for the mel filterbank, onnx to
write the graph). The serving path never imports this module.

The graph does the whole GE2E front end so a caller only cuts windows of raw samples:

    audio_windows (batch, 25840) float32, 16 kHz
      -> framed DFT as a strided Conv (n_fft 400, hop 160, periodic Hann) -> power spectrum (batch, 201, 160)
      -> mel filterbank (40 bands, Slaney) -> (batch, 160, 40), the same (non-log) mel GE2E was trained on
      -> 3-layer LSTM (hidden 256) -> last hidden state -> Linear 256 -> ReLU -> L2 normalise
    embeddings (batch, 256) float32, unit length, non-negative entries

We write the graph with ``onnx.helper`` rather than tracing it through ``torch.onnx`` so the exported
operators do not change with the torch release, and the weights are copied verbatim.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from sleuthd.audio.windows import WindowSpec
from sleuthd.encoders.manifest import sha256_of

logger = logging.getLogger(__name__)

N_FFT = 400
N_MELS = 40
HIDDEN = 256
LAYERS = 3
EMBEDDING_SIZE = 256
OPSET = 17
INPUT_NAME = "audio_windows"
OUTPUT_NAME = "embeddings"


def resemblyzer_checkpoint() -> Path:
    """Path of the pretrained GE2E weights inside the installed resemblyzer package."""
    import importlib.util

    spec = importlib.util.find_spec("resemblyzer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("resemblyzer is not installed: install the export extra (pip install '.[export]')")
    path = Path(next(iter(spec.submodule_search_locations))) / "pretrained.pt"
    if not path.exists():
        raise RuntimeError(f"resemblyzer is installed but its weights are missing at {path}")
    return path


def _dft_kernels() -> np.ndarray:
    """Conv weights (2 * (N_FFT//2 + 1), 1, N_FFT): windowed cosines then windowed negative sines."""
    n = np.arange(N_FFT)
    k = np.arange(N_FFT // 2 + 1)[:, None]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / N_FFT)  # periodic Hann, as librosa/scipy use for STFT
    angle = 2 * np.pi * k * n / N_FFT
    real = np.cos(angle) * window
    imag = -np.sin(angle) * window
    return np.concatenate([real, imag])[:, None, :].astype(np.float32)


def _mel_filterbank() -> np.ndarray:
    """(N_FFT//2 + 1, N_MELS) Slaney mel filterbank, the one GE2E's preprocessing used."""
    import librosa

    return librosa.filters.mel(sr=16_000, n_fft=N_FFT, n_mels=N_MELS).T.astype(np.float32)


def _reorder_gates(w: np.ndarray) -> np.ndarray:
    """PyTorch stores LSTM gates as (input, forget, cell, output); ONNX wants (input, output, forget, cell)."""
    i, f, g, o = np.split(w, 4, axis=0)
    return np.concatenate([i, o, f, g], axis=0)


def build_graph(state: dict[str, np.ndarray], spec: WindowSpec) -> Any:
    """The ONNX model for a GE2E state dict (numpy arrays keyed as in resemblyzer's VoiceEncoder)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    nodes = [
        helper.make_node("Unsqueeze", [INPUT_NAME, const("axis1", np.array([1], np.int64))], ["wave3d"]),
        helper.make_node(
            "Conv", ["wave3d", const("dft", _dft_kernels())], ["spec"], strides=[spec.hop_samples]
        ),  # (batch, 402, frames)
        helper.make_node(
            "Split",
            ["spec", const("split_sizes", np.array([N_FFT // 2 + 1] * 2, np.int64))],
            ["re", "im"],
            axis=1,
        ),
        helper.make_node("Mul", ["re", "re"], ["re2"]),
        helper.make_node("Mul", ["im", "im"], ["im2"]),
        helper.make_node("Add", ["re2", "im2"], ["power"]),  # (batch, 201, frames)
        helper.make_node("Transpose", ["power"], ["power_t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["power_t", const("mel_fb", _mel_filterbank())], ["mel"]),
        helper.make_node("Transpose", ["mel"], ["x0"], perm=[1, 0, 2]),  # (frames, batch, 40)
    ]
    x = "x0"
    for layer in range(LAYERS):
        w = _reorder_gates(state[f"lstm.weight_ih_l{layer}"])[None]
        r = _reorder_gates(state[f"lstm.weight_hh_l{layer}"])[None]
        b = np.concatenate(
            [_reorder_gates(state[f"lstm.bias_ih_l{layer}"]), _reorder_gates(state[f"lstm.bias_hh_l{layer}"])]
        )[None]
        y, yh = f"y{layer}", f"yh{layer}"
        nodes.append(
            helper.make_node(
                "LSTM",
                [x, const(f"W{layer}", w), const(f"R{layer}", r), const(f"B{layer}", b)],
                [y, yh],
                hidden_size=HIDDEN,
            )
        )
        if layer < LAYERS - 1:  # (frames, 1, batch, H) -> (frames, batch, H)
            nodes.append(
                helper.make_node("Squeeze", [y, const(f"ax{layer}", np.array([1], np.int64))], [f"x{layer + 1}"])
            )
            x = f"x{layer + 1}"
    last = f"yh{LAYERS - 1}"
    nodes += [
        helper.make_node("Squeeze", [last, const("ax_h", np.array([0], np.int64))], ["hidden"]),
        helper.make_node(
            "Gemm",
            ["hidden", const("lin_w", state["linear.weight"]), const("lin_b", state["linear.bias"])],
            ["proj"],
            transB=1,
        ),
        helper.make_node("Relu", ["proj"], ["relu"]),
        helper.make_node("ReduceL2", ["relu"], ["norm"], axes=[1], keepdims=1),
        # A window of pure silence can drive every unit to zero; keep the division finite.
        helper.make_node("Max", ["norm", const("eps", np.array([1e-12], np.float32))], ["norm_safe"]),
        helper.make_node("Div", ["relu", "norm_safe"], [OUTPUT_NAME]),
    ]
    graph = helper.make_graph(
        nodes,
        "ge2e_speaker_encoder",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", spec.window_samples])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", EMBEDDING_SIZE])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="sleuthd")
    model.ir_version = 8  # readable by every ONNX Runtime release since 1.14
    onnx.checker.check_model(model)
    return model


def load_resemblyzer_state(checkpoint: Path) -> dict[str, np.ndarray]:
    import torch

    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in ckpt["model_state"].items()}


def export(out_path: Path, spec: WindowSpec) -> dict[str, Any]:
    """Write the ONNX graph; returns facts for the manifest (source checkpoint and its hash)."""
    import onnx

    checkpoint = resemblyzer_checkpoint()
    model = build_graph(load_resemblyzer_state(checkpoint), spec)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out_path))
    from importlib.metadata import version

    logger.info("wrote %s from %s", out_path, checkpoint)
    return {
        "package": "resemblyzer",
        "package_version": version("resemblyzer"),
        "file": "resemblyzer/pretrained.pt",
        "file_sha256": sha256_of(checkpoint),
        "exporter": f"sleuthd onnx.helper graph, onnx {version('onnx')}, opset {OPSET}",
    }
