"""Audio in: container sniffing, decoding and resampling to 16 kHz mono, loudness, VAD, encoder windows."""
