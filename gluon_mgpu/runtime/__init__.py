"""Platform plumbing under the chapter: threads, per-device dispatch, the start-up checks, the GPU
build's libraries, numeric precision and safe files (docs/speed.md, docs/gpu.md)."""
