"""Controller-side model work: synthetic checkpoints, fetch, convert, manifest, verify."""
