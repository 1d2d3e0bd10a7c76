"""Operations: Prometheus metrics, structured logs, the observer protocols the engine reports through."""
