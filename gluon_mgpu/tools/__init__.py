"""Measurement tools beyond the chapter: BatchNorm statistics for the book table's diagnosis and
folded-BatchNorm inference for the benchmarks."""
