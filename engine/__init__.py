"""rlgate embedded engine: a CPU inference server speaking SGLang's native protocol."""
