"""Cheaper CAM++ graphs on the CPU, each against the float model (numbers for docs/research/fused-speed/, not a test).

For every variant: the cosine of its embeddings with the float model's on the real FSDD turns shipped in
``sleuthd/export/parity_clips`` (3 and 10 joined takes, cut into the served 3 s windows, both raw as the export's
parity check feeds them and as the server prepares them: loudness-normalised and silence-trimmed), and its CPU
time per window on one thread (``time.thread_time``, so other load on a shared machine does not count; best of
``--rounds``). The gate a variant must pass before it may ship: min cosine >= 0.999 here, then the dev benchmark.

Variants: ONNX Runtime's graph optimisation levels (and the ALL level's graph saved offline); dynamic int8
(``quantize_dynamic``: ConvInteger, weights QInt8/QUInt8); static int8 QDQ (``quantize_static``, per-channel
weights, activations calibrated on windows of the dev benchmark's fit voices, never the parity clips) of every
Conv, of the 2-D head's only and of the TDNN's only. The front end's DFT Conv stays float in every int8 variant
(quantised, it alone takes the cosine under 0.6).

    python scripts/campplus_variants.py [--models models] [--calibration data/dev/large/corpus/synth]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quant_pre_process,
    quantize_dynamic,
    quantize_static,
)
from sleuthd.audio.decode import Waveform, to_model_rate
from sleuthd.audio.vad import EnergyVad
from sleuthd.encoders.clips import prepare_waveform
from sleuthd.encoders.manifest import load_encoder_manifest
from sleuthd.export import parity as par

FEATURES = "unsqueeze_50"  # the front end's output: log-mel features, mean-normalised (the 2-D head's input)
HEAD_END = "reshape_150"  # the 2-D head's output, the TDNN's input
OPENVINO_VARIANTS = {
    "float32": [(None, None, "f32")],
    "bf16 after the front end": [(None, FEATURES, "f32"), (FEATURES, None, "bf16")],
    "bf16 TDNN only": [(None, FEATURES, "f32"), (FEATURES, HEAD_END, "f32"), (HEAD_END, None, "bf16")],
}
CLIPS = Path(__file__).resolve().parents[1] / "service" / "sleuthd" / "export" / "parity_clips"
LEVELS = {
    "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all (served)": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def session(path: Path, level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            save: Path | None = None) -> ort.InferenceSession:  # fmt: skip
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.graph_optimization_level = 1, 1, level
    if save is not None:
        so.optimized_model_filepath = str(save)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def openvino_model(
    path: Path, segments: list[tuple[str | None, str | None, str]], threads: int = 0
) -> Callable[[np.ndarray], np.ndarray]:
    """CAM++ through OpenVINO's CPU plugin, cut at named tensors into segments (start, end, precision: "f32" or
    "bf16"), each compiled with its own inference precision; (batch, samples) -> (batch, 192), unit rows."""
    import openvino as ov
    import openvino.opset13 as ops

    core = ov.Core()

    def tensor(model: ov.Model, name: str) -> ov.Output:
        for op in model.get_ordered_ops():
            for out in op.outputs():
                if name in out.get_names():
                    return out
        raise KeyError(name)

    config: dict[str, object] = {"INFERENCE_NUM_THREADS": threads} if threads else {}
    requests = []
    for start, end, precision in segments:
        model = core.read_model(str(path))
        params = model.get_parameters()
        if start is not None:
            src = tensor(model, start)
            param = ops.parameter(src.get_partial_shape(), ov.Type.f32, name="segment_input")
            for target in list(src.get_target_inputs()):
                target.replace_source_output(param.output(0))
            params = [param]
        results = model.get_results() if end is None else [ops.result(tensor(model, end))]
        compiled = core.compile_model(
            ov.Model(results, params), "CPU", {**config, "INFERENCE_PRECISION_HINT": precision}
        )
        requests.append(compiled.create_infer_request())

    def run(x: np.ndarray) -> np.ndarray:
        for request in requests:
            x = request.infer({0: x})[0].copy()
        return x

    return run


def embed(s: ort.InferenceSession, windows: np.ndarray, batch: int = 8) -> np.ndarray:
    return np.concatenate(
        [s.run(None, {"audio_windows": windows[i : i + batch]})[0] for i in range(0, len(windows), batch)]
    )


def cpu_ms(s: ort.InferenceSession, windows: np.ndarray, batch: int, rounds: int) -> float:
    x = np.resize(windows, (batch, windows.shape[1])).astype(np.float32)
    s.run(None, {"audio_windows": x})
    best = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time()
        s.run(None, {"audio_windows": x})
        best = min(best, time.thread_time() - t0)
    return 1e3 * best / batch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("models"))
    ap.add_argument("--calibration", type=Path, default=Path("data/dev/large/corpus/synth"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--openvino-only", action="store_true", help="only the float model and the OpenVINO rows")
    args = ap.parse_args()
    manifest = load_encoder_manifest(args.models / "campplus")
    vad = EnergyVad()
    turns = par.fsdd_turns(CLIPS, 3) + par.fsdd_turns(CLIPS, 10)
    raw = par.cut_windows(turns, manifest.window)
    served = np.concatenate([w for t in turns if (w := prepare_waveform(t, manifest, vad).windows) is not None])
    import soundfile as sf

    files = sorted(args.calibration.glob("espeak-*/0[0-3].wav"))[::3][:48]
    calib = []
    for f in files:
        samples, rate = sf.read(f, dtype="float32")
        w = prepare_waveform(to_model_rate(Waveform(samples, rate)).samples, manifest, vad).windows
        if w is not None:
            calib.append(w)
    calib_windows = np.concatenate(calib)
    print(f"parity windows: {len(raw)} raw, {len(served)} served; {len(calib_windows)} calibration windows "
          f"from {len(files)} fit-voice clips", flush=True)  # fmt: skip
    float_session = session(manifest.path)
    ref = embed(float_session, raw), embed(float_session, served)

    def report(name: str, s: ort.InferenceSession) -> None:
        cos = [float(np.min(np.sum(embed(s, w) * r, axis=1))) for w, r in zip((raw, served), ref, strict=True)]
        print(f"| {name} | {cos[0]:.5f} | {cos[1]:.5f} | {cpu_ms(s, served, 1, args.rounds):.1f} "
              f"| {cpu_ms(s, served, 8, args.rounds):.1f} | {'yes' if min(cos) >= par.MIN_COSINE else 'no'} |",
              flush=True)  # fmt: skip

    print("| variant | min cosine, raw windows | min cosine, served windows | CPU ms/window, batch 1 "
          "| CPU ms/window, batch 8 | parity >= 0.999 |\n| --- | ---: | ---: | ---: | ---: | :--- |")  # fmt: skip
    report("float, ALL (served)", float_session)
    try:
        import openvino  # noqa: F401
    except ImportError:
        print("(no openvino: its rows are skipped; pip install openvino)", flush=True)
    else:
        for name, segments in OPENVINO_VARIANTS.items():
            model = openvino_model(manifest.path, segments, threads=1)

            def ov_embed(w: np.ndarray, model: Callable[[np.ndarray], np.ndarray] = model) -> np.ndarray:
                out = np.concatenate([model(w[i : i + 8]) for i in range(0, len(w), 8)])
                return out / np.linalg.norm(out, axis=1, keepdims=True)

            def wall_ms(batch: int, model: Callable[[np.ndarray], np.ndarray] = model) -> float:
                x = np.resize(served, (batch, served.shape[1])).astype(np.float32)
                model(x)
                best = float("inf")
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    model(x)
                    best = min(best, time.perf_counter() - t0)
                return 1e3 * best / batch

            cos = [float(np.min(np.sum(ov_embed(w) * r, axis=1))) for w, r in zip((raw, served), ref, strict=True)]
            print(f"| OpenVINO {name} (wall clock) | {cos[0]:.5f} | {cos[1]:.5f} | {wall_ms(1):.1f} | {wall_ms(8):.1f} "
                  f"| {'yes' if min(cos) >= par.MIN_COSINE else 'no'} |", flush=True)  # fmt: skip
    if args.openvino_only:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, level in LEVELS.items():
            report(f"float, {name}", session(manifest.path, level, work / "offline.onnx" if "all" in name else None))
        report("float, ALL saved offline", session(work / "offline.onnx", ort.GraphOptimizationLevel.ORT_DISABLE_ALL))
        pre = work / "pre.onnx"
        quant_pre_process(str(manifest.path), str(pre), skip_symbolic_shape=True)
        model = onnx.load(str(pre))
        for k, node in enumerate(model.graph.node):
            node.name = node.name or f"{node.op_type}_{k}"  # the exclusion lists need names
        onnx.save(model, str(pre))
        inits = {i.name: list(i.dims) for i in model.graph.initializer}
        convs = [n for n in model.graph.node if n.op_type == "Conv"]
        front = [n.name for n in convs if inits.get(n.input[1], [])[1:] == [1, 400]]  # the DFT, frame 400
        head = [n.name for n in convs if len(inits.get(n.input[1], [])) == 4]
        tdnn = [n.name for n in convs if n.name not in front and n.name not in head]
        for weight in (QuantType.QInt8, QuantType.QUInt8):
            out = work / f"dynamic_{weight.name}.onnx"
            quantize_dynamic(str(pre), str(out), weight_type=weight, per_channel=True, op_types_to_quantize=["Conv"],
                             nodes_to_exclude=front)  # fmt: skip
            report(f"dynamic int8, weights {weight.name}", session(out))

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.rows = iter([{"audio_windows": calib_windows[i : i + 1]} for i in range(len(calib_windows))])

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self.rows, None)

        statics: list[tuple[str, list[str], CalibrationMethod]] = [
            ("every Conv, MinMax", front, CalibrationMethod.MinMax),
            ("every Conv, percentile 99.99", front, CalibrationMethod.Percentile),
            ("2-D head only", front + tdnn, CalibrationMethod.MinMax),
            ("TDNN only", front + head, CalibrationMethod.MinMax),
        ]
        for name, keep, method in statics:
            out = work / "static.onnx"
            quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            op_types_to_quantize=["Conv"], nodes_to_exclude=keep, calibrate_method=method,
                            extra_options={"CalibPercentile": 99.99})  # fmt: skip
            report(f"static int8 QDQ, {name}", session(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
