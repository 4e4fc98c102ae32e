"""Measurement tools beyond the chapter: BatchNorm statistics for the book table's diagnosis
(docs/notebooks.md) and folded-BatchNorm inference for the benchmarks (docs/speed.md).
"""
