"""RL training: GRPO maths, training samples, the torch trainer, its optimizer and checkpoints."""
