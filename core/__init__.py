"""The shared Transformer core: model, decoding, training engine, data plumbing, checkpoints."""
