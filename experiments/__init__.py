"""The experiment harness: configs in, correctness-checked timings out (records.jsonl, W&B)."""
