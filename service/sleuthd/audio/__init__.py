"""Audio in: container sniffing, decoding and resampling to 16 kHz mono, loudness, VAD, encoder windows."""

# Every clip is decoded and resampled to this rate (Hz): the encoders, the VAD and the LALM judge all hear it.
SAMPLE_RATE = 16_000
