"""The data stage: manifests, TFRecord shards (reading each member's share, writing, staging),
the embedded synthetic dataset, Slim preprocessing, and the exactly-once epoch ledger."""
