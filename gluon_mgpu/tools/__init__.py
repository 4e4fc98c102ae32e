"""Measurement tools beyond the chapter: BatchNorm statistics for the book table's diagnosis
(docs/notebooks.md)."""
