"""The engine: the façade the servicer calls, stream sessions, model loading and admission. Never imports grpc."""
