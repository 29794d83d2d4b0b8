"""Step handlers, one per step type; the engine looks them up by the definition's names."""
