"""Model setup and state for a job's training: starting weights, fine-tuning modes, LoRA, EMA, checkpoints."""
